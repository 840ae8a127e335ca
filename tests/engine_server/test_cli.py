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
    saved = local.create_lora_training_client(NANO, rank=2).result().save_weights_external("hf").result()
    folder = str(next((tmp_path / "made").glob("*/external_weights/hf")))
    assert saved.path.endswith("/external_weights/hf")
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


@pytest.mark.slow
def test_aliases_metadata_across_a_restart_and_the_request_log(tmp_path: Path) -> None:
    """A recipe's model name served by a local model; the run's user_metadata and name survive a
    restart of the engine; refused and failed calls leave one log line each, and no progress bars."""
    recipe_model = "Qwen/Qwen3-8B-Base"
    args = ["--model-alias", f"{recipe_model}={NANO}"]
    with EngineProcess(tmp_path / "engine", extra_args=args) as engine:
        rest = tinker.RestClient(base_url=engine.url, api_key=engine.api_key)
        names = [m.model_name for m in rest.get_server_capabilities().result().supported_models]
        assert recipe_model in names
        service = tinker.ServiceClient(base_url=engine.url, api_key=engine.api_key)
        metadata = {"renderer_name": "role_colon"}
        trainer = service.create_lora_training_client(recipe_model, rank=4, user_metadata=metadata).result()
        assert trainer.get_info().model_data.model_name == recipe_model
        assert len(trainer.get_tokenizer().encode("hi")) == 2  # the built-in byte-level tokenizer
        path = trainer.save_state("first").result().path
        sampler = service.create_sampling_client(base_model=recipe_model).result()
        assert sampler.get_base_model() == recipe_model
        with pytest.raises(tinker.RequestFailedError, match="Qwen/Qwen3-4B"):
            service.create_lora_training_client("Qwen/Qwen3-4B", rank=4).result()  # no alias: refused
        with pytest.raises(tinker.RequestFailedError, match=r"data\[0\]"):
            bad = types.Datum(
                model_input=types.ModelInput.from_ints([1, 2]),
                loss_fn_inputs={"target_tokens": [1], "weights": [1.0]},
            )
            trainer.forward_backward([bad], "cross_entropy").result()
        with pytest.raises(tinker.NotFoundError):
            rest.get_training_run("no-such-run").result()
        service.close("success").result()

    with EngineProcess(tmp_path / "engine", extra_args=args) as engine:  # the same folder, a new process
        rest = tinker.RestClient(base_url=engine.url, api_key=engine.api_key)
        run = rest.get_training_run_by_tinker_path(path).result()
        assert (run.base_model, run.user_metadata) == (recipe_model, metadata)
        assert rest.get_weights_info_by_tinker_path(path).result().base_model == recipe_model
        service = tinker.ServiceClient(base_url=engine.url, api_key=engine.api_key)
        resumed = service.create_training_client_from_state_with_optimizer(path).result()
        assert rest.get_training_run(resumed.model_id).result().user_metadata == metadata
        service.close("success").result()

    lines = engine.log_file.read_text().splitlines()
    refused = [line for line in lines if " refused " in line or " failed " in line]
    assert any("POST /api/v1/create_model failed" in line and "Qwen/Qwen3-4B" in line for line in refused)
    assert any("POST /api/v1/forward_backward failed" in line and "data[0]" in line for line in refused)
    assert any("GET /api/v1/training_runs/no-such-run refused 404" in line for line in refused)
    assert len(refused) == 3, refused
    assert not [line for line in lines if "%|" in line or "it/s]" in line]  # no progress bars


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--model", "/no/such/folder"], 1, "a .gguf file or a local Hugging Face model folder"),
        (["--api-key", "secret"], 2, "--api-key must start with 'tml-'"),
        (["--model-alias", "Qwen/Qwen3-8B"], 2, "--model-alias: expected key=value, got 'Qwen/Qwen3-8B'"),
        (["--model-alias", "Qwen/Qwen3-8B=/no/such/folder"], 1, "a .gguf file or a local Hugging Face"),
    ],
)
def test_engine_refuses_bad_options_with_one_line(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    result = CliRunner().invoke(app, ["engine", "--dir", str(tmp_path), "--port", "1", *args])
    assert result.exit_code == code
    assert message in " ".join(result.stderr.replace("│", " ").split())
    assert code == 2 or "cannot start" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
