"""Training runs and their checkpoints as Tinker's REST API describes them, read from the engine's folder.

A run's checkpoints live under ``<engine dir>/<run id>/(weights|sampler_weights)/<name>/`` with a
``checkpoint.json`` (see :mod:`tinkertrace.engine.storage`); these helpers turn them into
``tinker.types.Checkpoint`` / ``TrainingRun`` / ``WeightsInfoResponse`` objects.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinker import types

from tinkertrace.engine.storage import META_FILE, SAMPLER_WEIGHTS, WEIGHTS, CheckpointStore, check_name

_CHECKPOINT_TYPE = {WEIGHTS: "training", SAMPLER_WEIGHTS: "sampler"}


def _checkpoint(folder: Path, kind: str) -> tuple[types.Checkpoint, dict[str, Any]] | None:
    meta_file = folder / META_FILE
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    checkpoint = types.Checkpoint(
        checkpoint_id=f"{kind}/{folder.name}",
        checkpoint_type=_CHECKPOINT_TYPE[kind],  # type: ignore[arg-type]
        time=datetime.fromtimestamp(meta_file.stat().st_mtime, tz=UTC),
        tinker_path=str(meta.get("path", "")),
        size_bytes=size,
        user_metadata={str(k): str(v) for k, v in (meta.get("user_metadata") or {}).items()} or None,
    )
    return checkpoint, meta


def list_checkpoints(store: CheckpointStore, run_id: str) -> list[types.Checkpoint]:
    """Every readable checkpoint of ``run_id``, oldest first (none for an unknown run)."""
    run_folder = store.base_dir / check_name(run_id, "run id")
    found: list[types.Checkpoint] = []
    for kind in (WEIGHTS, SAMPLER_WEIGHTS):
        for folder in sorted((run_folder / kind).glob("*")):
            if folder.is_dir() and not folder.name.startswith("."):
                entry = _checkpoint(folder, kind)
                if entry is not None:
                    found.append(entry[0])
    return sorted(found, key=lambda c: c.time)


def run_spec(store: CheckpointStore, run_id: str) -> dict[str, Any] | None:
    """The model spec recorded with any of the run's checkpoints, or None."""
    run_folder = store.base_dir / check_name(run_id, "run id")
    for meta_file in sorted(run_folder.glob(f"*/*/{META_FILE}")):
        try:
            return dict(json.loads(meta_file.read_text())["spec"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            continue
    return None


def training_run(
    run_id: str, spec: dict[str, Any], checkpoints: list[types.Checkpoint], last_request: datetime
) -> types.TrainingRun:
    """A ``TrainingRun`` from the engine's model spec and the run's checkpoints."""
    rank = int(spec.get("lora_rank", 0))
    last = {kind: [c for c in checkpoints if c.checkpoint_type == kind] for kind in ("training", "sampler")}
    return types.TrainingRun(
        training_run_id=run_id,
        base_model=str(spec["base_model"]),
        model_owner="local",
        is_lora=rank > 0,
        lora_rank=rank or None,
        last_request_time=last_request,
        last_checkpoint=last["training"][-1] if last["training"] else None,
        last_sampler_checkpoint=last["sampler"][-1] if last["sampler"] else None,
    )


def weights_info(meta: dict[str, Any]) -> types.WeightsInfoResponse:
    """``WeightsInfoResponse`` of a checkpoint from its ``checkpoint.json``."""
    spec = meta["spec"]
    rank = int(spec.get("lora_rank", 0))
    return types.WeightsInfoResponse(
        base_model=str(spec["base_model"]),
        is_lora=rank > 0,
        lora_rank=rank or None,
        train_unembed=spec.get("train_unembed"),
        train_mlp=spec.get("train_mlp"),
        train_attn=spec.get("train_attn"),
    )


def storage_usage(store: CheckpointStore) -> tuple[int, int]:
    """How many checkpoints the engine folder holds, and their total size in bytes."""
    folders = [meta.parent for meta in store.base_dir.glob(f"*/*/*/{META_FILE}")]
    size = sum(f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file())
    return len(folders), size
