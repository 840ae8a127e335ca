"""Reply budgets of `tinkertrace train --config` over environments (agents run here, through the real
endpoint it starts): an environment's ``max_tokens`` when it sets one, else REPLY_TOKENS — what the
OpenReward agent asks for, and the endpoint's default for an agent that asks for nothing — never the
identity demo's 20 tokens. Checked on what the agents' spans recorded: the requested cap and the
reply's token count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tinkertrace.spanstore.reader import open_spans
from tinkertrace.testing.waiting import wait_until
from tinkertrace.training.config import REPLY_TOKENS

from .conftest import OrsServer

NANO = "tinkertrace/tiny-chat:nano"  # random weights: most replies run for 100-500 tokens

AGENT = """
import openai
import tinkertrace


@tinkertrace.traced_rollout
async def ask(task, *, base_url, model, temperature):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused")
    messages = [{"role": "user", "content": "Tell me a long story."}]
    await client.chat.completions.create(model=model, messages=messages, temperature=temperature)
    return 0.0


def tasks(split="train"):
    return [{"id": f"story-{i}"} for i in range(4)]
"""


def replies(spans: Path) -> dict[str, list[tuple[int | None, int]]]:
    """Per environment, each answered policy call's requested ``max_tokens`` and reply length."""
    query = (
        "select split_part(task_id, '/', 1), "
        """json_extract(attributes, '$."gen_ai.request.max_tokens"')::int, len(response_token_ids) """
        "from spans where span_type = 'llm' and response_token_ids is not null"
    )
    with duckdb.connect() as con:
        open_spans(con, spans)
        rows = con.execute(query).fetchall()
    out: dict[str, list[tuple[int | None, int]]] = {}
    for env, cap, length in rows:
        out.setdefault(env, []).append((cap, length))
    return out


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_replies_get_the_environment_cap_else_the_reply_budget(ors_server: OrsServer, tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    log = tmp_path / "run"
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model_name: {NANO}\nlora_rank: 2\nbatch_size: 12\nlog_path: {log}\nenvironments:\n"
        f"  {ors_server.url}/arithmetic: {{num_rollouts: 2, max_turns: 1, max_tokens: 7}}\n"
        f"  {ors_server.url}/whodunit: {{num_rollouts: 2, max_turns: 1}}\n"
        "  story: {agent: agent.py:ask, tasks: agent.py:tasks, num_rollouts: 4}\n"
    )
    env = {**os.environ, "TINKER_API_KEY": "", "OPENREWARD_API_KEY": ""}
    command = [sys.executable, "-m", "tinkertrace.cli.main", "train", "--config", str(config), "--workers=2"]
    out = (tmp_path / "train.log").open("wb")
    run = subprocess.Popen([*command, "--no-progress"], stdout=out, stderr=subprocess.STDOUT, env=env)

    def enough() -> bool:
        seen = replies(log / "spans")
        return all(seen.get(name) for name in ("arithmetic", "whodunit")) and len(seen.get("story", [])) >= 4

    try:
        wait_until(lambda: run.poll() is not None or enough(), 300, "replies of every environment")
        assert run.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    seen = replies(log / "spans")
    # the environment's own cap, asked for and kept
    assert {cap for cap, _ in seen["arithmetic"]} == {7}
    assert max(length for _, length in seen["arithmetic"]) <= 7
    # no cap set: the OpenReward agent asks for the reply budget
    assert {cap for cap, _ in seen["whodunit"]} == {REPLY_TOKENS}
    assert max(length for _, length in seen["whodunit"]) <= REPLY_TOKENS
    # an agent that asks for no cap gets the endpoint's default: the reply budget, not 20 tokens
    assert {cap for cap, _ in seen["story"]} == {None}
    lengths = [length for _, length in seen["story"]]
    assert max(lengths) > 20 and max(lengths) <= REPLY_TOKENS, lengths
