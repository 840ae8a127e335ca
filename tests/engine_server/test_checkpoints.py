"""Checkpoint management through the real ``tinker`` SDK: deletion, expiry (TTL), weights export and
its signed download URLs, run metadata."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pyrage
import pytest
import tinker
import torch
from tinker import types
from transformers import AutoModelForCausalLM

from tinkertrace.engine import ServiceClient as LocalServiceClient
from tinkertrace.engine_server import EngineSettings, create_app
from tinkertrace.netutil import BackgroundServer

from .conftest import KEY, NANO, TEXTS, RunningEngine, datum


def _wait_until(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    assert condition(), "condition not reached in time"  # type: ignore[operator]


def test_user_metadata_is_kept_with_the_run_and_its_resumptions(
    engine: RunningEngine, sdk: tinker.ServiceClient
) -> None:
    rest = tinker.RestClient(base_url=engine.url, api_key=KEY)
    trainer = sdk.create_lora_training_client(
        NANO, rank=4, seed=0, user_metadata={"renderer_name": "role_colon"}
    ).result()
    run = rest.get_training_run(trainer.model_id).result()
    assert run.user_metadata == {"renderer_name": "role_colon"}
    path = trainer.save_state("meta").result().path
    assert rest.get_training_run_by_tinker_path(path).result().user_metadata == {
        "renderer_name": "role_colon"
    }
    assert (engine.engine_dir / trainer.model_id / "run.json").is_file()

    resumed = sdk.create_training_client_from_state_with_optimizer(
        path, user_metadata={"attempt": "2"}
    ).result()
    again = rest.get_training_run(resumed.model_id).result()
    assert again.user_metadata == {"renderer_name": "role_colon", "attempt": "2"}  # kept, then updated
    listed = {r.training_run_id: r for r in rest.list_training_runs(limit=1000).result().training_runs}
    assert listed[trainer.model_id].user_metadata == {"renderer_name": "role_colon"}


def test_checkpoints_are_deleted_through_the_rest_client(
    engine: RunningEngine, sdk: tinker.ServiceClient
) -> None:
    rest = tinker.RestClient(base_url=engine.url, api_key=KEY)
    trainer = sdk.create_lora_training_client(NANO, rank=4, seed=0).result()
    first = trainer.save_state("rolling-1").result().path
    second = trainer.save_state("rolling-2").result().path
    sampler = trainer.save_weights_for_sampler("s").result().path

    rest.delete_checkpoint_from_tinker_path(first).result()
    rest.delete_checkpoint(trainer.model_id, "sampler_weights/s").result()
    assert [c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result().checkpoints] == [second]
    assert not (engine.engine_dir / trainer.model_id / "weights" / "rolling-1").exists()
    with pytest.raises(tinker.RequestFailedError, match="not found"):
        sdk.create_training_client_from_state(first).result()
    with pytest.raises(tinker.NotFoundError, match="not found"):
        rest.delete_checkpoint_from_tinker_path(first).result()
    with pytest.raises(tinker.NotFoundError):
        sdk.create_sampling_client(model_path=sampler).result()
    assert sdk.create_training_client_from_state(second).result().get_info().lora_rank == 4


def test_expired_checkpoints_vanish_and_a_ttl_can_be_lifted(tmp_path: Path) -> None:
    local = LocalServiceClient(tmp_path / "engine", device="cpu", cpu_threads=1)
    app = create_app(local, EngineSettings(checkpoint_sweep_s=0.1))
    with BackgroundServer(app) as server:
        service = tinker.ServiceClient(base_url=server.url, api_key=KEY)
        rest = tinker.RestClient(base_url=server.url, api_key=KEY)
        trainer = service.create_lora_training_client(NANO, rank=4, seed=0).result()
        lifted = trainer.save_state("lifted", ttl_seconds=60).result().path
        rest.set_checkpoint_ttl_from_tinker_path(lifted, None).result()
        kept = trainer.save_state("kept").result().path
        short = trainer.save_state("short", ttl_seconds=3).result().path
        listed = {c.tinker_path: c for c in rest.list_checkpoints(trainer.model_id).result().checkpoints}
        assert listed[short].expires_at is not None
        assert listed[kept].expires_at is None and listed[lifted].expires_at is None

        run_dir = tmp_path / "engine" / trainer.model_id / "weights"
        _wait_until(lambda: not (run_dir / "short").exists())  # swept once its 3 s had passed
        assert (run_dir / "lifted").is_dir() and (run_dir / "kept").is_dir()
        paths = [c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result().checkpoints]
        assert paths == [lifted, kept]  # oldest first
        with pytest.raises(tinker.RequestFailedError, match="not found"):
            service.create_training_client_from_state(short).result()
        with pytest.raises(tinker.BadRequestError, match="ttl_seconds"):
            rest.set_checkpoint_ttl_from_tinker_path(kept, -5).result()
        service.close("success").result(timeout=30)


def _download(rest: object, path: str, into: Path) -> dict[str, str]:
    """What ``tinker checkpoint download`` and the cookbook do: signed URLs, then plain GETs."""
    urls = rest.get_external_weights_urls(path).result()  # type: ignore[attr-defined]
    assert urls.expires.timestamp() > time.time() + 600
    into.mkdir(parents=True)
    for name, url in urls.urls.items():
        urllib.request.urlretrieve(url, str(into / name))  # no API key, as the SDK's CLI does
    return urls.urls


def test_weights_export_downloads_as_a_hugging_face_folder(
    engine: RunningEngine, sdk: tinker.ServiceClient, tmp_path: Path
) -> None:
    trainer = sdk.create_lora_training_client(NANO, rank=4, seed=0).result()
    trainer.forward_backward([datum(t) for t in TEXTS], "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    exported = trainer.save_weights_external("final").result().path
    assert exported == f"tinker://{trainer.model_id}/external_weights/final"
    rest = tinker.RestClient(base_url=engine.url, api_key=KEY)
    checkpoints = rest.list_checkpoints(trainer.model_id).result().checkpoints
    assert [(c.checkpoint_type, c.tinker_path) for c in checkpoints] == [("external", exported)]

    urls = _download(rest, exported, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(urls)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    ids = datum(TEXTS[0]).model_input.to_ints()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    mine = torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()
    trained = trainer.forward([datum(TEXTS[0])], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(mine, trained.to_numpy()[:-1], atol=1e-4)  # the trained weights, LoRA merged

    url = urls["config.json"]
    forged = httpx.get(url.replace("signature=", "signature=0"))
    assert forged.status_code == 403 and "signature" in forged.json()["detail"]
    assert httpx.get(url.split("?")[0]).status_code == 403  # unsigned
    rest.delete_checkpoint_from_tinker_path(exported).result()
    assert httpx.get(url).status_code == 404  # deleted: its URLs stop working


def test_weights_export_encrypts_to_age_recipients(
    engine: RunningEngine, sdk: tinker.ServiceClient, tmp_path: Path
) -> None:
    """The cookbook's ``weights.download`` of a training checkpoint asks for an age-encrypted export."""
    identity = pyrage.x25519.Identity.generate()
    trainer = sdk.create_lora_training_client(NANO, rank=4, seed=0).result()
    encrypted = trainer.save_weights_external("enc", age_encryption_recipients=[str(identity.to_public())])
    plain = trainer.save_weights_external("plain").result().path
    rest = tinker.RestClient(base_url=engine.url, api_key=KEY)
    names = _download(rest, encrypted.result().path, tmp_path / "enc")
    _download(rest, plain, tmp_path / "plain")
    assert names and all(name.endswith(".age") for name in names), sorted(names)
    decrypted = pyrage.decrypt((tmp_path / "enc" / "config.json.age").read_bytes(), [identity])
    assert decrypted == (tmp_path / "plain" / "config.json").read_bytes()
    with pytest.raises(tinker.RequestFailedError, match="age_encryption_recipients"):
        trainer.save_weights_external("bad", age_encryption_recipients=["not-a-key"]).result()
