"""Loud when nothing trains: why the groups seen could not be trained, and what to try.

A group trains only when its rollouts' rewards differ (its centred advantage is otherwise zero), it
has rewards at all, and its rollouts have token ids. :class:`GroupTally` counts the groups a trainer
saw, by that verdict (:data:`UNTRAINABLE`), with the rewards of the constant ones and how many of
their replies the reply cap cut. :func:`untrainable_message` says it in words, with the advice, for
batch mode's error and follow mode's warning alike.

:class:`TrainabilityWatch` is follow mode's: fed each step's tally, it counts the groups since the
last trainable one (the *streak*) and, once ``warn_groups`` of them or ``warn_s`` seconds have gone
by, raises an alert, then again every ``repeat_s`` seconds while the streak lasts; past
``give_up_groups`` groups, or ``give_up_s`` seconds once ``warn_groups`` groups were seen (a single
slow group is no reason to give up), its alert says to give up (the trainer does, with ``max_steps``
set). :func:`announce` shows an alert on the console, in Python ``logging`` and in
``LOG_DIR/warnings.jsonl``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.markup import escape

from tinkertrace.training.jsonl import append_jsonl

log = logging.getLogger(__name__)

WARNINGS_FILE = "warnings.jsonl"
CUT_SHARE_HIGH = 0.5
"""Above this share of replies cut by the reply cap, the advice names a larger reply budget first."""
UNTRAINABLE = {
    "constant_reward": "with a constant reward",
    "failed": "with no reward (every rollout failed or emitted none)",
    "no_token_ids": "without token ids (the builder made no trajectory of their rollouts)",
    "other": "with nothing left to train",
}
"""Why a group could not be trained → how the message says it."""


@dataclass
class GroupTally:
    """Groups seen: how many, how many trainable, the others by reason (:data:`UNTRAINABLE`), the
    reward of each constant-reward group, and the replies of the untrainable groups (cut by the reply
    cap: ``replies_cut``; replies of unknown state are not counted)."""

    groups: int = 0
    trainable: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    rewards: Counter[float] = field(default_factory=Counter)
    replies: int = 0
    replies_cut: int = 0

    def add(self, other: GroupTally) -> None:
        """Count ``other``'s groups too."""
        self.groups += other.groups
        self.trainable += other.trainable
        self.reasons.update(other.reasons)
        self.rewards.update(other.rewards)
        self.replies += other.replies
        self.replies_cut += other.replies_cut

    @property
    def cut_share(self) -> float | None:
        """The share of the counted replies cut by the reply cap (None when none was counted)."""
        return self.replies_cut / self.replies if self.replies else None


def replies_of(table: pa.Table) -> tuple[pa.Array, pa.Array]:
    """Per trajectory row: its replies (``num_turns``, 1 when absent) and how many were cut
    (``replies_cut``); both 0 where the cut count is unknown (null or no column)."""
    n = table.num_rows
    cut = table["replies_cut"] if "replies_cut" in table.column_names else pa.nulls(n, pa.int32())
    turns = table["num_turns"] if "num_turns" in table.column_names else pa.array([1] * n, pa.int32())
    known = pc.is_valid(cut)
    zero = pa.scalar(0, pa.int64())
    return pc.if_else(known, pc.cast(turns, pa.int64()), zero), pc.fill_null(pc.cast(cut, pa.int64()), 0)


def tally_groups(table: pa.Table, keys: pa.ChunkedArray | pa.Array, trained: set[str]) -> GroupTally:
    """The verdict on each group (``keys``: the group key per row) of ``table``'s trajectory rows: a
    group is trainable when any of its rollouts is in ``trained``; else, by its rewards, constant (the
    one value recorded), failed (none valid) or other."""
    replies, cut = replies_of(table)
    reward = pc.cast(table["reward"], pa.float64())
    frame = pa.table(
        {
            "key": keys,
            "trained": pc.is_in(table["rollout_id"], pa.array(sorted(trained), pa.string())),
            "reward": pc.if_else(pc.is_nan(reward), None, reward),
            "replies": replies,
            "cut": cut,
        }
    )
    groups = frame.group_by("key").aggregate(
        [("trained", "any"), ("reward", "min"), ("reward", "max"), ("replies", "sum"), ("cut", "sum")]
    )
    tally = GroupTally(groups=groups.num_rows)
    idle = groups.filter(pc.invert(groups["trained_any"]))
    tally.trainable = groups.num_rows - idle.num_rows
    for low, high, replies_n, cut_n in zip(
        *(idle[c].to_pylist() for c in ("reward_min", "reward_max", "replies_sum", "cut_sum")), strict=True
    ):  # one iteration per untrainable group, not per row
        reason = "failed" if low is None else "constant_reward" if low == high else "other"
        tally.reasons[reason] += 1
        if reason == "constant_reward":
            tally.rewards[float(low)] += 1
        tally.replies += replies_n
        tally.replies_cut += cut_n
    return tally


def _rewards_phrase(rewards: Counter[float]) -> str:
    if len(rewards) == 1:
        return f"every reward {next(iter(rewards)):g}"
    shown = ", ".join(f"{value:g} in {n}" for value, n in rewards.most_common(5))
    return "one reward per group: " + shown + (", ..." if len(rewards) > 5 else "")


def untrainable_advice(tally: GroupTally) -> list[str]:
    """What to try, for the reasons in ``tally`` (a larger reply budget first when most replies were
    cut)."""
    advice = []
    share = tally.cut_share
    if share is not None and share > CUT_SHARE_HIGH:
        advice.append("a larger reply budget (max_tokens), since most replies were cut")
    if tally.reasons["constant_reward"]:
        advice += [
            "more rollouts per group (group_size / num_rollouts), so that some differ",
            "a reward that gives partial credit",
            "--keep-constant-reward-groups (they train with zero advantage: a step runs, nothing is learned)",
        ]
    if tally.reasons["failed"]:
        advice.append(
            "the agents' errors (a failed rollout has no reward; LOG_DIR/agents when they run here)"
        )
    if tally.reasons["no_token_ids"]:
        advice.append(
            "an endpoint that returns token ids (tinkertrace serve; vLLM's return_token_ids), or "
            "`tinkertrace build --tokenizer` for text-only spans"
        )
    return advice


def untrainable_message(tally: GroupTally, *, so_far: str = "") -> str:
    """``tally``'s untrainable groups in words (how many, why, the rewards, the share of replies cut)
    and the advice. ``so_far`` qualifies the count (e.g. "in the last 60 s")."""
    untrainable = tally.groups - tally.trainable
    whole = "all " if tally.trainable == 0 else ""
    parts = []
    for reason, how in UNTRAINABLE.items():
        if n := tally.reasons[reason]:
            rewards = f" ({_rewards_phrase(tally.rewards)})" if reason == "constant_reward" else ""
            parts.append(f"{n} {how}{rewards}")
    share = tally.cut_share
    if share is None:
        cut = "no record of replies cut by the reply cap"
    else:
        cut = f"{share:.0%} of their replies cut by the reply cap" + (
            " (high)" if share > CUT_SHARE_HIGH else ""
        )
    counted = f"{whole}{untrainable} groups" + (f" {so_far}" if so_far else "")
    return f"no group could be trained: {counted}: {'; '.join(parts)}; {cut}. Try: " + "; ".join(
        untrainable_advice(tally)
    )


@dataclass
class Alert:
    """What the watch has to say: the message, and whether the limit to give up was reached."""

    message: str
    give_up: bool
    tally: GroupTally


@dataclass
class WatchLimits:
    """When the watch speaks (see the module docstring); a None bound never triggers."""

    warn_groups: int
    warn_s: float
    repeat_s: float
    give_up_groups: int | None = None
    give_up_s: float | None = None


class TrainabilityWatch:
    """Counts the untrainable groups since the last trainable one and says when to warn or give up."""

    def __init__(self, limits: WatchLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self.clock = limits, clock
        self.streak = GroupTally()
        self.since: float | None = None  # when the streak's first group was seen
        self.last_alert: float | None = None

    def observe(self, tally: GroupTally) -> None:
        """Count a step's (or poll's) groups: a trainable one ends the streak."""
        if tally.trainable:
            self.streak, self.since, self.last_alert = GroupTally(), None, None
        elif tally.groups:
            self.streak.add(tally)
            self.since = self.clock() if self.since is None else self.since

    def check(self) -> Alert | None:
        """An alert when one is due now, else None."""
        if self.since is None:
            return None
        lim, now, groups = self.limits, self.clock(), self.streak.groups
        elapsed = now - self.since
        give_up = (lim.give_up_groups is not None and groups >= lim.give_up_groups) or (
            lim.give_up_s is not None and elapsed >= lim.give_up_s and groups >= lim.warn_groups
        )
        if self.last_alert is None:
            due = groups >= lim.warn_groups or elapsed >= lim.warn_s
        else:
            due = now - self.last_alert >= lim.repeat_s
        if not (due or give_up):
            return None
        self.last_alert = now
        message = untrainable_message(self.streak, so_far=f"in {elapsed:.0f} s")
        return Alert(message, give_up, self.streak)


def announce(alert: Alert, console: Console | None, log_dir: Path, step: int) -> None:
    """Show ``alert`` on ``console`` (when given; ``logging`` then gets it at INFO, else at WARNING)
    and append it to ``LOG_DIR/warnings.jsonl`` (``kind`` untrainable, with its counts). An alert to
    give up is only recorded (``logging`` at INFO): the error that ends the run says it."""
    shown = console is not None and not alert.give_up
    if console is not None and shown:
        console.print(f"[yellow]warning:[/] {escape(alert.message)}", highlight=False, soft_wrap=True)
    log.log(logging.INFO if shown or alert.give_up else logging.WARNING, "%s", alert.message)
    tally = alert.tally
    record = {
        "time": time.time(),
        "kind": "untrainable",
        "step": step,
        "groups": tally.groups,
        "reasons": dict(tally.reasons),
        "rewards": {f"{value:g}": n for value, n in tally.rewards.items()},
        "cut_share": tally.cut_share,
        "give_up": alert.give_up,
        "message": alert.message,
    }
    append_jsonl(Path(log_dir) / WARNINGS_FILE, [record])
