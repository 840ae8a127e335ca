"""Training runs and their checkpoints as Tinker's REST API describes them, read from the engine's folder.

A run's record is ``<engine dir>/<run id>/run.json`` (model spec, the model name it was asked for,
``user_metadata``); its checkpoints live under ``<engine dir>/<run id>/<kind>/<name>/`` with a
``checkpoint.json`` (see :mod:`tinkertrace.engine.storage`). These helpers turn them into
``tinker.types.Checkpoint`` / ``TrainingRun`` / ``WeightsInfoResponse`` objects.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinker import types

from tinkertrace.engine.storage import (
    EXTERNAL_WEIGHTS,
    KINDS,
    META_FILE,
    RUN_FILE,
    SAMPLER_WEIGHTS,
    WEIGHTS,
    CheckpointStore,
    check_name,
    is_expired,
)

_CHECKPOINT_TYPE: dict[str, types.CheckpointType] = {
    WEIGHTS: "training",
    SAMPLER_WEIGHTS: "sampler",
    EXTERNAL_WEIGHTS: "external",
}


def folder_size(folder: Path) -> int:
    """Bytes in every file under ``folder``."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _time(seconds: Any) -> datetime | None:
    return datetime.fromtimestamp(seconds, tz=UTC) if isinstance(seconds, int | float) else None


def _checkpoint(folder: Path, kind: str) -> types.Checkpoint | None:
    """The checkpoint in ``folder``; None when it is unreadable or expired."""
    meta_file = folder / META_FILE
    try:
        meta = json.loads(meta_file.read_text())
        created = _time(meta.get("created")) or datetime.fromtimestamp(meta_file.stat().st_mtime, tz=UTC)
        size = folder_size(folder)
    except (OSError, json.JSONDecodeError):
        return None
    if is_expired(meta):
        return None
    return types.Checkpoint(
        checkpoint_id=f"{kind}/{folder.name}",
        checkpoint_type=_CHECKPOINT_TYPE[kind],
        time=created,
        tinker_path=str(meta.get("path", "")),
        size_bytes=size,
        user_metadata={str(k): str(v) for k, v in (meta.get("user_metadata") or {}).items()} or None,
        expires_at=_time(meta.get("expires_at")),
    )


def list_checkpoints(store: CheckpointStore, run_id: str) -> list[types.Checkpoint]:
    """Every readable, unexpired checkpoint of ``run_id``, oldest first (none for an unknown run)."""
    run_folder = store.base_dir / check_name(run_id, "run id")
    found = [
        _checkpoint(folder, kind)
        for kind in KINDS
        for folder in sorted((run_folder / kind).glob("*"))
        if folder.is_dir() and not folder.name.startswith(".")
    ]
    return sorted((c for c in found if c is not None), key=lambda c: c.time)


def run_ids(store: CheckpointStore) -> list[str]:
    """Every run the engine folder knows: those with a record or with saved training states."""
    base = store.base_dir
    return sorted(p.name for p in base.glob("*") if (p / RUN_FILE).is_file() or (p / WEIGHTS).is_dir())


def run_record(store: CheckpointStore, run_id: str) -> dict[str, Any] | None:
    """The run's record (``run.json``), else one rebuilt from any of its checkpoints (runs saved
    before records existed), else None."""
    record = store.read_run(run_id)
    if record is not None:
        return record
    run_folder = store.base_dir / check_name(run_id, "run id")
    for meta_file in sorted(run_folder.glob(f"*/*/{META_FILE}")):
        try:
            meta = json.loads(meta_file.read_text())
            return {"spec": dict(meta["spec"]), "model_name": meta.get("model_name"), "user_metadata": {}}
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            continue
    return None


def training_run(
    run_id: str, record: dict[str, Any], checkpoints: list[types.Checkpoint], last_request: datetime
) -> types.TrainingRun:
    """A ``TrainingRun`` from the run's record and checkpoints."""
    spec = record["spec"]
    rank = int(spec.get("lora_rank", 0))
    last = {kind: [c for c in checkpoints if c.checkpoint_type == kind] for kind in ("training", "sampler")}
    metadata = record.get("user_metadata") or {}
    return types.TrainingRun(
        training_run_id=run_id,
        base_model=str(record.get("model_name") or spec["base_model"]),
        model_owner="local",
        is_lora=rank > 0,
        lora_rank=rank or None,
        last_request_time=last_request,
        last_checkpoint=last["training"][-1] if last["training"] else None,
        last_sampler_checkpoint=last["sampler"][-1] if last["sampler"] else None,
        user_metadata={str(k): str(v) for k, v in metadata.items()} or None,
    )


def weights_info(meta: dict[str, Any]) -> types.WeightsInfoResponse:
    """``WeightsInfoResponse`` of a checkpoint from its ``checkpoint.json``."""
    spec = meta["spec"]
    rank = int(spec.get("lora_rank", 0))
    return types.WeightsInfoResponse(
        base_model=str(meta.get("model_name") or spec["base_model"]),
        is_lora=rank > 0,
        lora_rank=rank or None,
        train_unembed=spec.get("train_unembed"),
        train_mlp=spec.get("train_mlp"),
        train_attn=spec.get("train_attn"),
    )


def storage_usage(store: CheckpointStore) -> tuple[int, int]:
    """How many checkpoints the engine folder holds, and their total size in bytes."""
    folders = [
        meta.parent
        for meta in store.base_dir.glob(f"*/*/*/{META_FILE}")
        if not meta.parent.name.startswith(".")
    ]
    return len(folders), sum(folder_size(folder) for folder in folders)
