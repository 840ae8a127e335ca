"""`tinkertrace engine` as a user starts it: a real process serving a local Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinker
from tinker import types
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.engine import ServiceClient as LocalServiceClient
from tinkertrace.engine_server.process import EngineProcess

from .conftest import NANO, TEXTS, datum


@pytest.mark.slow
def test_engine_process_serves_a_local_hugging_face_folder(tmp_path: Path) -> None:
    local = LocalServiceClient(tmp_path / "made", device="cpu")
    saved = local.create_lora_training_client(NANO, rank=2).result().save_weights_for_sampler("hf").result()
    folder = str(next((tmp_path / "made").glob("*/sampler_weights/hf")))
    assert saved.path.endswith("/sampler_weights/hf")
    with EngineProcess(tmp_path / "engine", require_key=True, extra_args=["--model", folder]) as engine:
        rest = tinker.RestClient(base_url=engine.url, api_key=engine.api_key)
        assert folder in [m.model_name for m in rest.get_server_capabilities().result().supported_models]
        service = tinker.ServiceClient(base_url=engine.url, api_key=engine.api_key)
        trainer = service.create_lora_training_client(folder, rank=4, seed=0).result()
        assert trainer.get_info().model_data.model_name == folder
        loss = trainer.forward_backward([datum(TEXTS[0])], "cross_entropy").result().metrics["loss:sum"]
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        after = trainer.forward([datum(TEXTS[0])], "cross_entropy").result().metrics["loss:sum"]
        assert after < loss
        service.close("success").result()
    log = engine.log_file.read_text()
    assert f"http://127.0.0.1:{engine.port}" in log and "API key as given" in log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/no/such/folder"], "a .gguf file or a local Hugging Face model folder"),
        (["--api-key", "secret"], "must start with 'tml-'"),
    ],
)
def test_engine_refuses_bad_options_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["engine", "--dir", str(tmp_path), "--port", "1", *args])
    assert result.exit_code == 1
    assert "cannot start" in result.stderr and message in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
