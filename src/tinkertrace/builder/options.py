"""What to build: filters, the reward assignment policy and incremental-build inputs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, get_args

from tinkertrace import semconv
from tinkertrace.settings import check_choices, raise_problems, setting

RewardPolicy = Literal["nearest", "sibling", "link", "final"]
GroupBy = Literal["task", "task+agent"]
REWARD_POLICIES: tuple[str, ...] = get_args(RewardPolicy)  # the ui's menu (the Literal is the list)

# Rollout statuses `statuses` selects: the root span's tinkertrace.rollout.status ("timed_out": closed by
# the endpoint after its idle time), or "unknown" when the rollout has no root or its producer records
# none (Agent-lightning).
STATUSES: tuple[str, ...] = ("succeeded", "failed", "timed_out", "unknown")
MAX_BUCKETS = 256


@dataclass(frozen=True)
class BuildSettings:
    """Options of :func:`tinkertrace.builder.build_trajectories` (and of ``build-trajectories``: each
    field with help text is an option and a ``--config`` key).

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

    since: datetime | None = setting(
        None, "Only rollouts that started at or after this ISO date/time (UTC unless it names a zone)."
    )
    until: datetime | None = setting(
        None, "Only rollouts that started before this ISO date/time (UTC unless it names a zone)."
    )
    splits: tuple[str, ...] = setting(
        (), "Only rollouts of this split (train, eval); repeatable.", flags=("--split",)
    )
    tasks: tuple[str, ...] = setting((), "Only rollouts of this task id; repeatable.", flags=("--task",))
    statuses: tuple[str, ...] = setting(
        (),
        "Only rollouts with this status: succeeded, failed (the agent raised), timed_out or unknown (no root "
        "span or no status recorded); repeatable. Default: all, failed ones included.",
        flags=("--status",),
    )
    agent: str | None = setting(
        None, "Only LLM calls whose agent name matches this regular expression (searched, RE2)."
    )
    min_policy_version: int | None = setting(None, "Only LLM calls sampled by this policy version or newer.")
    reward_policy: RewardPolicy = setting(
        "nearest",
        "How rewards reach LLM calls (calls with token ids only): nearest (newest earlier unrewarded call of "
        "the reward's agent span, else of the rollout), sibling (same, under the same parent span), link (by "
        "gen_ai.response.id, else nearest), final (the rollout's final reward on every call).",
    )
    reward_name: str | None = setting(
        None, "Reward dimension to use (default: each reward's primary dimension)."
    )
    group_by: GroupBy = setting("task", "GRPO group key of trajectories: task or task+agent.")
    include_incomplete: bool = setting(
        False,
        "Also build rollouts whose root span is missing or that lack LLM/reward spans their root counted.",
    )
    exclude_rollouts: frozenset[str] = setting(frozenset())
    files: tuple[Path, ...] | None = setting(None)
    memory_limit: str = setting(
        "512MB",
        "DuckDB memory limit (e.g. 512MB, 2GB); DuckDB spills past it to a temporary folder and the token "
        "data is processed in buckets sized from it. Peak memory is about this limit + ~200 MB, whatever "
        "the data size.",
    )
    threads: int | None = setting(None, "DuckDB threads (default: all cores).")
    batch_rows: int = setting(4096)
    buckets: int | None = setting(
        None,
        f"Process the token data in this many slices (1-{MAX_BUCKETS}); default: from the token data's size "
        "and --memory-limit. Output is identical whatever the count.",
    )
    task_key: str = setting(
        semconv.TASK_ID,
        "For traces without tinkertrace's SDK (no span carries a rollout id: each trace's root span is a "
        "rollout), the root span's (or resource's) attribute naming the task, the GRPO group key: e.g. "
        "session.id, gen_ai.conversation.id.",
    )
    tokenizer: str | None = setting(
        None,
        "Tokenizer of the served model (tinkertrace/tiny-chat, smollm2-135m-instruct, a .gguf file or a "
        "local Hugging Face folder): re-tokenises LLM calls whose producer stored text only (OpenLLMetry, "
        "the official GenAI instrumentation, Logfire) with its chat template, tools included; those "
        "triplets say token_source = retokenized. Without it such calls are counted, not built.",
    )

    def __post_init__(self) -> None:
        """Store the collection fields immutably (any iterable is accepted); check the values (a
        ConfigError naming each problem): options built in code are checked as a command's are."""
        for name in ("splits", "statuses", "tasks"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "exclude_rollouts", frozenset(self.exclude_rollouts))
        if self.files is not None:
            object.__setattr__(self, "files", tuple(Path(f) for f in self.files))
        unknown = sorted(set(self.statuses) - set(STATUSES))
        checks = [
            *check_choices(self),  # reward_policy, group_by: their Literals
            (self.batch_rows >= 1, f"batch_rows must be positive, got {self.batch_rows}"),
            (
                self.buckets is None or 1 <= self.buckets <= MAX_BUCKETS,
                f"buckets must be between 1 and {MAX_BUCKETS}, got {self.buckets}",
            ),
            (bool(self.task_key), "task_key must name an attribute"),
            (not unknown, f"statuses must be among {', '.join(STATUSES)}, got {', '.join(unknown)}"),
        ]
        raise_problems(checks, "invalid build settings")
