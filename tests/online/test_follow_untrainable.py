"""Follow mode when nothing can be trained: it warns (console, LOG_DIR/warnings.jsonl) after the
documented count of untrainable groups, ends with a clear error under --max-steps, and keeps going
once a group trains. Real span folders, the real builder and the built-in tiny model."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from tests.training.span_groups import write_groups
from tinkertrace.online.follow import FollowResult, FollowTrainer
from tinkertrace.online.settings import FollowSettings
from tinkertrace.testing.waiting import wait_until
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.errors import DataError
from tinkertrace.training.jsonl import read_jsonl
from tinkertrace.training.metrics import read_metrics
from tinkertrace.training.trainability import WARNINGS_FILE

MODEL = "tinkertrace/tiny-chat:nano"
CUT_HALF = [[True], [False], [True], [False]]


def trainer(tmp_path: Path, **options: object) -> FollowTrainer:
    config = TrainSettings(
        source=tmp_path / "spans", model=MODEL, backend="local", log_dir=tmp_path / "run",
        engine_dir=tmp_path / "engine", groups_per_batch=1, lora_rank=4,
    )  # fmt: skip
    settings = {"group_size": 4, "max_staleness": None, "poll_s": 0.1, "idle_timeout_s": 3.0, **options}
    return FollowTrainer(config, FollowSettings(**settings))  # type: ignore[arg-type]


def test_a_constant_reward_run_warns_after_the_documented_count(tmp_path: Path) -> None:
    """Three groups, every reward 0, half the replies cut: one warning, once the third group was seen
    (before, the run went on without a word until it was stopped)."""
    write_groups(tmp_path / "spans", {f"c{g}": [0.0] * 4 for g in range(3)}, cut=CUT_HALF)
    shown = io.StringIO()
    result = trainer(tmp_path, untrainable_warn_groups=3).run(
        console=Console(file=shown, width=400), progress=False
    )
    assert (result.steps, result.rollouts_dropped_constant) == (0, 12)
    text = shown.getvalue()
    assert text.count("warning:") == 1, text
    assert "no group could be trained: all 3 groups in " in text
    assert "3 with a constant reward (every reward 0); 50% of their replies cut by the reply cap" in text
    assert "more rollouts per group (group_size / num_rollouts)" in text
    assert "--keep-constant-reward-groups" in text and "partial credit" in text
    (record,) = read_jsonl(tmp_path / "run" / WARNINGS_FILE)
    assert (record["groups"], record["reasons"], record["rewards"]) == (3, {"constant_reward": 3}, {"0": 3})
    assert record["cut_share"] == 0.5 and record["give_up"] is False


def test_rollouts_without_token_ids_are_counted_and_named(tmp_path: Path) -> None:
    """Rollouts the builder makes no trajectory of never reached the trainer: now they count."""
    write_groups(tmp_path / "spans", {"n0": [0.0, 1.0] * 2, "n1": [1.0, 0.0] * 2}, token_ids=False)
    shown = io.StringIO()
    trainer(tmp_path, untrainable_warn_groups=2).run(console=Console(file=shown, width=400), progress=False)
    assert "all 2 groups in " in shown.getvalue()
    assert "2 without token ids" in shown.getvalue() and "return_token_ids" in shown.getvalue()


def test_groups_without_rewards_are_counted_as_failed(tmp_path: Path) -> None:
    write_groups(tmp_path / "spans", {"f0": [None] * 4, "c0": [0.5] * 4})
    shown = io.StringIO()
    trainer(tmp_path, untrainable_warn_groups=2).run(console=Console(file=shown, width=400), progress=False)
    text = shown.getvalue()
    assert "all 2 groups in " in text and "1 with a constant reward (every reward 0.5)" in text
    assert "1 with no reward (every rollout failed or emitted none)" in text and "the agents' errors" in text


def test_with_max_steps_a_run_that_cannot_train_ends_with_a_clear_error(tmp_path: Path) -> None:
    write_groups(tmp_path / "spans", {f"c{g}": [1.0] * 4 for g in range(3)})
    follow = trainer(tmp_path, max_steps=1, untrainable_give_up_groups=3, idle_timeout_s=20.0)
    with pytest.raises(DataError) as raised:
        follow.run(progress=False)
    message = str(raised.value)
    assert message.startswith("no group could be trained: all 3 groups in ")
    assert "every reward 1" in message and "Gave up short of --max-steps 1" in message
    (record,) = read_jsonl(tmp_path / "run" / WARNINGS_FILE)
    assert record["give_up"] is True


def test_the_cli_shows_the_error_and_exits_non_zero(tmp_path: Path) -> None:
    write_groups(tmp_path / "spans", {f"c{g}": [0.0] * 4 for g in range(2)})
    done = subprocess.run(
        [
            sys.executable, "-m", "tinkertrace.cli.main", "train", str(tmp_path / "spans"), "--follow",
            "--model", MODEL, "--backend", "local", "--log-dir", str(tmp_path / "run"),
            "--engine-dir", str(tmp_path / "engine"), "--group-size", "4", "--groups-per-batch", "1",
            "--poll-seconds", "0.1", "--max-steps", "1", "--untrainable-give-up-groups", "2",
            "--idle-timeout", "30", "--no-progress",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: no group could be trained: all 2 groups" in " ".join(done.stderr.split())
    assert done.stderr.count("no group could be trained") == 1  # the error alone, not a warning beside it


def test_one_trainable_group_after_constant_ones_does_not_end_the_run(tmp_path: Path) -> None:
    """Two constant groups (a warning, not the end: the limit is three), then a group whose rewards
    differ: it trains, the run reaches --max-steps and ends without an error."""
    spans = tmp_path / "spans"
    write_groups(spans, {"c0": [0.0] * 4, "c1": [0.0] * 4})
    follow = trainer(tmp_path, max_steps=1, untrainable_warn_groups=2, untrainable_give_up_groups=3)
    shown, outcome = io.StringIO(), {}

    def run() -> None:
        try:
            outcome["result"] = follow.run(console=Console(file=shown, width=400), progress=False)
        except Exception as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(
        lambda: follow.watch.streak.groups == 2 or not thread.is_alive(), 60, "two constant groups seen"
    )
    write_groups(spans, {"m": [0.0, 1.0, 0.0, 1.0]}, name="part-1.parquet")
    thread.join(60)
    assert "error" not in outcome, outcome
    result: FollowResult = outcome["result"]
    assert (result.steps, result.rollouts_trained, result.rollouts_dropped_constant) == (1, 4, 8)
    assert "all 2 groups in " in shown.getvalue()
    assert follow.watch.streak.groups == 0  # the trained group ended the streak
    (step,) = read_metrics(tmp_path / "run")
    assert step["env/all/replies/cut_share"] == 0.0  # none of its replies was cut
