"""What to build: filters, the reward assignment policy and incremental-build inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

RewardPolicy = Literal["nearest", "sibling", "link", "final"]
GroupBy = Literal["task", "task+agent"]

REWARD_POLICIES: tuple[str, ...] = ("nearest", "sibling", "link", "final")
GROUP_BYS: tuple[str, ...] = ("task", "task+agent")
# Rollout statuses `statuses` selects: the root span's tinkertrace.rollout.status, or "unknown" when the
# rollout has no root or its producer records none (Agent-lightning).
STATUSES: tuple[str, ...] = ("succeeded", "failed", "unknown")
MAX_BUCKETS = 256


@dataclass(frozen=True)
class BuildOptions:
    """Options of :func:`tinkertrace.builder.build_trajectories`.

    Rollout filters (``since``/``until`` on the rollout's start time, ``splits``, ``tasks``,
    ``statuses``) select whole rollouts; ``statuses`` empty (the default) keeps every status, so a
    rollout that raised is built like the others (its rewards, often a 0, are training signal; leaving
    failures out would bias a GRPO group toward its successes): pass ``("succeeded",)`` to drop them;
    ``agent`` (a regular expression searched in the agent name) and
    ``min_policy_version`` select LLM calls after rewards were assigned, so filtering never changes
    which reward a call gets.

    Traces without our SDK: where no span carries a rollout id, a trace's root span is a rollout, its
    task id the root's attribute ``task_key`` (e.g. ``session.id``); calls whose producer stored text
    only are re-tokenised with ``tokenizer`` (the served model's), else counted as not rebuilt.

    Incremental builds (the online trainer): ``exclude_rollouts`` skips rollouts already built;
    ``files`` reads only these Parquet files instead of every file under the spans folder (a rollout
    whose spans are split between listed and unlisted files then looks incomplete and is left out).
    """

    since: datetime | None = None
    until: datetime | None = None
    splits: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    agent: str | None = None
    min_policy_version: int | None = None
    reward_policy: RewardPolicy = "nearest"
    reward_name: str | None = None
    group_by: GroupBy = "task"
    include_incomplete: bool = False
    exclude_rollouts: frozenset[str] = field(default_factory=frozenset)
    files: tuple[Path, ...] | None = None
    memory_limit: str = "512MB"
    threads: int | None = None
    batch_rows: int = 4096
    buckets: int | None = None  # token-join slices; None: from the data size and memory_limit
    # a plain trace's (no rollout id anywhere) root span attribute naming its task (GRPO group key)
    task_key: str = "tinkertrace.task.id"
    # tokenizer (built-in name or local Hugging Face folder) re-tokenising calls recorded as text only
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.reward_policy not in REWARD_POLICIES:
            raise ValueError(f"reward_policy must be one of {REWARD_POLICIES}, got {self.reward_policy!r}")
        if self.group_by not in GROUP_BYS:
            raise ValueError(f"group_by must be one of {GROUP_BYS}, got {self.group_by!r}")
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows must be positive, got {self.batch_rows}")
        if self.buckets is not None and not 1 <= self.buckets <= MAX_BUCKETS:
            raise ValueError(f"buckets must be between 1 and {MAX_BUCKETS}, got {self.buckets}")
        if not self.task_key:
            raise ValueError("task_key must name an attribute")
        unknown = sorted(set(self.statuses) - set(STATUSES))
        if unknown:
            raise ValueError(f"statuses must be among {STATUSES}, got {unknown}")
        # Accept any iterable for the collection fields, store them immutably.
        object.__setattr__(self, "splits", tuple(self.splits))
        object.__setattr__(self, "statuses", tuple(self.statuses))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "exclude_rollouts", frozenset(self.exclude_rollouts))
        if self.files is not None:
            object.__setattr__(self, "files", tuple(Path(f) for f in self.files))
