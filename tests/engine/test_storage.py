"""CheckpointStore: expiry, deletion, TTL changes and run records, on real folders."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tinkertrace.engine.storage import (
    EXTERNAL_WEIGHTS,
    WEIGHTS,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStore,
    make_path,
)


def _save(store: CheckpointStore, name: str, ttl_seconds: int | None = None, kind: str = WEIGHTS) -> str:
    return store.write(
        "run-1",
        kind,
        name,
        {"spec": {}},
        lambda folder: (folder / "w.bin").write_bytes(b"x"),
        ttl_seconds=ttl_seconds,
    )


def test_expired_checkpoints_resolve_as_missing_and_are_swept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    lifted, kept, expiring = _save(store, "b", 60), _save(store, "c"), _save(store, "a", 1)
    store.set_ttl(lifted, None)
    _, meta = store.resolve(expiring)
    assert meta["expires_at"] == pytest.approx(time.time() + 1, abs=2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # wait for the expiry itself, not a fixed sleep
        try:
            store.resolve(expiring)
        except CheckpointNotFoundError as exc:
            assert "expired" in str(exc)
            break
        time.sleep(0.05)
    else:
        pytest.fail("the checkpoint never expired")
    assert (tmp_path / "run-1" / WEIGHTS / "a").is_dir()  # still on disk until a sweep
    assert store.sweep_expired() == [expiring]
    assert not (tmp_path / "run-1" / WEIGHTS / "a").exists()
    assert store.resolve(lifted)[1]["expires_at"] is None and store.resolve(kept)
    with pytest.raises(ValueError, match="ttl_seconds"):
        store.set_ttl(kept, 0)


def test_delete_and_run_records(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = _save(store, "export", kind=EXTERNAL_WEIGHTS)
    assert path == f"tinker://run-1/{EXTERNAL_WEIGHTS}/export"
    store.delete(path)
    assert not any((tmp_path / "run-1" / EXTERNAL_WEIGHTS).iterdir())  # no leftovers, hidden ones included
    with pytest.raises(CheckpointNotFoundError):
        store.delete(path)
    with pytest.raises(CheckpointError, match="must look like"):
        store.delete("tinker://run-1/other/x")
    with pytest.raises(CheckpointError, match="unknown checkpoint kind"):
        make_path("run-1", "other", "x")  # type: ignore[arg-type]

    assert store.read_run("run-1") is None
    store.write_run("run-1", {"user_metadata": {"renderer_name": "role_colon"}})
    assert store.read_run("run-1") == {"user_metadata": {"renderer_name": "role_colon"}}
    assert json.loads((tmp_path / "run-1" / "run.json").read_text())["user_metadata"]["renderer_name"]
