"""The hosted backend: the loop reaches Tinker only through the public SDK surface.

The service cannot be reached here, so `tinker.ServiceClient` is replaced by the local engine,
wrapped in proxies that refuse any attribute the real SDK classes lack; a real loopback HTTP
server answers the health probe. The loop then trains exactly as it would against hosted Tinker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tinker
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tinkertrace.engine import ServiceClient as LocalServiceClient
from tinkertrace.netutil import BackgroundServer
from tinkertrace.training import loop
from tinkertrace.training.backends import HEALTH_PATH
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import make_config

SDK_SERVICE_CLIENT = tinker.ServiceClient  # the real class, before a test replaces it


class SdkSurface:
    """Forwards to ``target`` only the public attributes that ``sdk_class`` has; records their use."""

    def __init__(self, target: Any, sdk_class: type, used: set[str]) -> None:
        self._target, self._sdk_class, self._used = target, sdk_class, used

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(self._sdk_class, name):
            raise AttributeError(f"{name!r} is not part of the public {self._sdk_class.__name__} API")
        self._used.add(f"{self._sdk_class.__name__}.{name}")
        attr = getattr(self._target, name)
        if name.startswith("create_") and "training_client" in name:
            return lambda *a, **k: _Resolved(
                SdkSurface(attr(*a, **k).result(), tinker.TrainingClient, self._used)
            )
        return attr


class _Resolved:
    def __init__(self, value: Any) -> None:
        self._value = value

    def result(self, timeout: float | None = None) -> Any:
        return self._value


@pytest.fixture
def health_server() -> Any:
    app = Starlette(routes=[Route(HEALTH_PATH, lambda request: JSONResponse({"status": "ok"}))])
    with BackgroundServer(app) as server:
        yield server


def test_loop_runs_unchanged_through_tinker_service_client(
    tmp_path: Path, trajectories_file: Path, monkeypatch: pytest.MonkeyPatch, health_server: BackgroundServer
) -> None:
    used: set[str] = set()
    made: list[dict[str, Any]] = []

    def service_client(**kwargs: Any) -> SdkSurface:
        made.append(kwargs)
        return SdkSurface(LocalServiceClient(base_dir=tmp_path / "engine"), SDK_SERVICE_CLIENT, used)

    monkeypatch.setattr(tinker, "ServiceClient", service_client)
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    monkeypatch.setenv("TINKER_BASE_URL", health_server.url)
    config = make_config(
        None,
        {
            "source": trajectories_file,
            "backend": "tinker",
            "model": "tinkertrace/tiny-chat:nano",
            "groups_per_batch": 4,
            "lora_rank": 4,
            "log_dir": tmp_path / "hosted",
        },
    )
    result = loop.run_training(config, progress=False)
    assert made == [{}]  # the SDK's own constructor: key and URL come from the environment
    assert result.steps == 1
    assert used >= {
        "ServiceClient.create_lora_training_client",
        "TrainingClient.forward_backward",
        "TrainingClient.optim_step",
        "TrainingClient.save_state",
        "TrainingClient.save_weights_for_sampler",
    }
    assert read_checkpoints(config.log_dir)[-1]["sampler_path"].startswith("tinker://")
