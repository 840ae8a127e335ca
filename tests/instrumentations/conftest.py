"""The real instrumentation packages' agents (run in ``.venv-instrumentations``) against our real
sampling endpoint (scripted model, built-in tokenizer) and our real collector process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer, free_ports
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.environments import require_built
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-instrumentations" / "bin" / "python"
APP = Path(__file__).with_name("agent_app.py")
# opentelemetry-util-genai < 1.0, put first on the path in the agent's `openai-v2-messages` mode
# (requirements-legacy-genai.txt): the pinned openai-v2 then sends per-message log events
LEGACY_GENAI = ROOT / ".venv-instrumentations" / "legacy-genai"
require_built(
    PYTHON.exists(),
    "the instrumentation packages' environment (.venv-instrumentations)",
    "instrumentations-env",
)


@dataclass
class Model:
    """The scripted model behind the endpoint: a tool call when tools are offered, else the sum."""

    replies: list[str] = field(default_factory=list)

    def __call__(self, prompt_ids: list[int]) -> str:
        prompt = load_tokenizer(BUILTIN_MODEL).decode(prompt_ids)
        a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1]
        if "# Tools" in prompt:
            call = {"name": "calculator", "arguments": {"expression": f"{a} + {b}"}}
            reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        else:
            reply = f"The answer is {int(a) + int(b)}."
        self.replies.append(reply)
        return reply


@dataclass
class Endpoint:
    url: str
    model: Model
    sampler: ScriptedTinkerSampler


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    """``tinkertrace serve``'s app on a free loopback port, sampling from the scripted model."""
    model = Model()
    sampler = ScriptedTinkerSampler(model)
    app = create_app(PolicyHolder(sampler, load_tokenizer(BUILTIN_MODEL), "test-model"))
    with BackgroundServer(app) as server:
        yield Endpoint(server.url + "/v1", model, sampler)


def run_agent(instrumentation: str, rollouts: int, out: Path, model_url: str, *extra: str) -> list[dict]:
    """Start a collector writing to ``out``, run the agent under ``instrumentation`` against it, stop
    the collector (so everything is in Parquet) and return what the agent printed."""
    http_port, grpc_port = free_ports(2)
    command = collector_command(out, http_port, "--grpc-port", str(grpc_port), "--instance", "test")
    collector = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_healthy(collector, http_port, timeout=60)
        env = dict(os.environ)
        if instrumentation == "openai-v2-messages":
            env["PYTHONPATH"] = str(LEGACY_GENAI)
        agent = subprocess.run(
            [str(PYTHON), str(APP), instrumentation, f"http://127.0.0.1:{http_port}", model_url,
             str(rollouts), *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=180, env=env,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-3000:]
    finally:
        collector.send_signal(signal.SIGTERM)
        output, _ = collector.communicate(timeout=60)
    assert collector.returncode == 0, output
    return json.loads(agent.stdout.strip().splitlines()[-1])


@pytest.fixture
def agent() -> object:
    """:func:`run_agent`, for the tests."""
    return run_agent
