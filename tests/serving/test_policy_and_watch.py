"""PolicyHolder ordering rules and checkpoint-record parsing (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinkertrace.serving.checkpoint_watch import CheckpointWatcher, parse_record
from tinkertrace.serving.policy import PolicyHolder, StalePolicyError


def test_swap_is_monotonic_and_snapshots_are_stable(tokenizer) -> None:
    holder = PolicyHolder("client-0", tokenizer, "m")
    before = holder.current()
    assert holder.swap("client-1").version == 1
    assert before.sampling_client == "client-0" and before.version == 0  # an in-flight snapshot
    assert holder.swap("client-5", 5).version == 5
    with pytest.raises(StalePolicyError):
        holder.swap("client-4", 4)
    assert holder.current().sampling_client == "client-5"
    with pytest.raises(RuntimeError, match="loader"):
        holder.load("tinker://run/sampler_weights/x")


class TakesOver:
    """A client the holder moves running requests onto itself (as the local engine's)."""

    def take_over(self, previous: object, version: int, recompute: bool = False) -> bool:
        return True


def test_the_sampler_kind_and_the_served_weights_changing_form(tokenizer) -> None:
    """Hosted clients (none the holder can take over) want Tinker inflight clients unless in-flight
    updates are off; a served version may come again only as the same weights in the other form."""
    assert PolicyHolder(TakesOver(), tokenizer, "m").sampler_kind == "snapshot"
    assert PolicyHolder("hosted", tokenizer, "m", inflight="off").sampler_kind == "snapshot"
    holder = PolicyHolder("hosted", tokenizer, "m", loader=lambda p: f"snapshot:{p}")
    assert holder.sampler_kind == "inflight"
    path = "tinker://r/sampler_weights/000003"
    holder.swap("inflight-3", 3, path, inflight=True)
    with pytest.raises(StalePolicyError):  # the same form again
        holder.swap("inflight-3b", 3, path, inflight=True)
    with pytest.raises(StalePolicyError):  # other weights under the served version
        holder.load("tinker://r/sampler_weights/other", 3)
    assert holder.load(path, 3).sampling_client == f"snapshot:{path}"  # a stopping trainer's hand-back
    assert not holder.current().inflight and holder.swaps == 2
    with pytest.raises(StalePolicyError):
        holder.load(path, 3)


def test_parse_record_reads_the_training_loop_format() -> None:
    record = parse_record(
        {"name": "000004", "step": 4, "state_path": "s", "sampler_path": "tinker://r/sampler_weights/4"}
    )
    assert record is not None and (record.model_path, record.version) == ("tinker://r/sampler_weights/4", 4)
    assert parse_record({"step": 2, "state_path": "tinker://r/weights/2"}) is None  # state only
    assert parse_record([1, 2]) is None
    assert parse_record({"model_path": "p", "policy_version": 9, "step": 3}).version == 9


def test_watcher_loads_only_the_newest_complete_record(tokenizer, tmp_path: Path) -> None:
    loaded: list[str] = []
    holder = PolicyHolder("base", tokenizer, "m", loader=lambda p: loaded.append(p) or f"client:{p}")
    path = tmp_path / "checkpoints.jsonl"
    watcher = CheckpointWatcher(path, holder)
    assert watcher.poll_once() is None  # no file yet
    lines = [json.dumps({"step": s, "sampler_path": f"p{s}"}) for s in (1, 2)]
    path.write_text(
        "\n".join(lines) + "\nnot json\n" + '{"step": 3, "sampler_'
    )  # last line still being written
    assert watcher.poll_once().version == 2 and loaded == ["p2"]
    assert watcher.skipped_lines == 1
    with path.open("a") as fh:
        fh.write('path": "p3"}\n')
    assert watcher.poll_once().version == 3 and loaded == ["p2", "p3"]
    assert watcher.poll_once() is None  # nothing new
    path.write_text(json.dumps({"step": 1, "sampler_path": "old"}) + "\n")  # replaced by an older run
    assert watcher.poll_once() is None and holder.version == 3  # older versions are not served


def test_watcher_survives_a_bad_checkpoint_path(tokenizer, tmp_path: Path) -> None:
    def loader(path: str) -> str:
        raise FileNotFoundError(f"no checkpoint at {path}")

    holder = PolicyHolder("base", tokenizer, "m", loader=loader)
    path = tmp_path / "checkpoints.jsonl"
    path.write_text(json.dumps({"step": 1, "sampler_path": "tinker://gone/sampler_weights/1"}) + "\n")
    watcher = CheckpointWatcher(path, holder)
    assert watcher.poll_once() is None and holder.version == 0
    assert "tinker://gone" in watcher.errors[0]
