"""Fixtures: the engine's Tinker API on a loopback port (uvicorn in a thread), driven by the real SDK."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tinker
from tinker import types

from tinkertrace.engine import ServiceClient as LocalServiceClient
from tinkertrace.engine_server import EngineSettings, create_app
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.testing.tinker_heartbeats import heartbeating_sessions, wait_heartbeats_stopped

NANO = f"{BUILTIN_MODEL}:nano"
KEY = "tml-engine-api-test"
TEXTS = (
    "<|im_start|>user\nadd 2 and 3<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n",
    "<|im_start|>user\nsay hi<|im_end|>\n<|im_start|>assistant\nhi there<|im_end|>\n",
)


@dataclass
class RunningEngine:
    """The server, the engine behind it, and its checkpoint folder."""

    url: str
    local: LocalServiceClient
    engine_dir: Path
    app: object


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    engine_dir = tmp_path_factory.mktemp("engine_api")
    local = LocalServiceClient(engine_dir, device="cpu", cpu_threads=1)
    app = create_app(local, EngineSettings(retrieve_poll_s=5.0))
    sessions = app.app.state.api.state.sessions  # type: ignore[attr-defined]
    with BackgroundServer(app) as server:
        yield RunningEngine(server.url, local, engine_dir, app)
        # the shadow holders of sampler handles beat on until a heartbeat is answered 410: give them it
        wait_heartbeats_stopped(sessions)
    assert not heartbeating_sessions() & set(sessions), "a Tinker SDK heartbeat outlived its engine"


@pytest.fixture(scope="module")
def sdk(engine: RunningEngine) -> Iterator[tinker.ServiceClient]:
    """The real, unchanged ``tinker.ServiceClient`` pointed at the engine."""
    client = tinker.ServiceClient(base_url=engine.url, api_key=KEY)
    yield client
    client.close("success").result(timeout=30)


def datum(text: str, loss_fn: str = "cross_entropy", advantage: float = 1.0) -> types.Datum:
    """One Datum of ``text`` for ``loss_fn`` (sampler logprobs a bit off the model's, so ratios move)."""
    ids = load_tokenizer(BUILTIN_MODEL).encode(text)
    n = len(ids) - 1
    if loss_fn == "cross_entropy":
        inputs = {"target_tokens": ids[1:], "weights": [0.0] * 4 + [1.0] * (n - 4)}
    else:
        inputs = {
            "target_tokens": ids[1:],
            "logprobs": [-5.3 - 0.01 * (i % 7) for i in range(n)],
            "advantages": [0.0] * 4 + [advantage] * (n - 4),
        }
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=inputs)
