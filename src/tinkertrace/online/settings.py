"""The online loop's settings: follow training, the local stack, the demo.

Each field is declared once with its help text (:func:`~tinkertrace.settings.setting`);
``tinkertrace train --follow`` and ``tinkertrace demo`` make their options from these fields. Light
on purpose: the command line imports this module to build its help.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tinkertrace.models.builtin import BUILTIN_MODEL, DEMO_MODEL
from tinkertrace.serving.policy import INFLIGHT_HELP, InflightMode
from tinkertrace.settings import check_choices, load, raise_problems, setting
from tinkertrace.training.config import REPLY_TOKENS, TrainSettings
from tinkertrace.training.offpolicy import DEFAULT_STALENESS_CAP

StalenessMode = Literal["drop", "correct", "downweight"]


@dataclass
class FollowSettings:
    """Follow-mode settings (the rest comes from :class:`~tinkertrace.training.config.TrainSettings`)."""

    group_size: int = setting(4, "Rollouts a group needs before it is trained (environments set their own).")
    group_timeout_s: float = setting(
        30.0, "Train a group with at least 2 rollouts after waiting this long, seconds.",
        flags=("--group-timeout",),
    )  # fmt: skip
    max_staleness: int | None = setting(
        4, "The bound: rollouts with a token sampled more than N policy versions ago are not trained."
    )
    staleness_mode: StalenessMode = setting(
        "drop",
        "'drop' drops a rollout over the bound (by its oldest token); 'correct' bounds each token (one "
        "over the bound gets no advantage), trains a group whole (dropped only when every rollout of it "
        "is over) and every kept token with the decoupled-PPO correction (each token weighted by "
        "min(p_trainer/p_sampler, --staleness-cap), clipped against the trainer's current policy, "
        "which acts with --num-substeps above 1; one extra forward pass per step); 'downweight' keeps "
        "stale rollouts, advantage × --staleness-decay per version over.",
    )
    staleness_cap: float = setting(
        DEFAULT_STALENESS_CAP, "With correct: the truncation C of the per-token importance weight."
    )
    staleness_decay: float = setting(
        0.5, "With downweight: a stale rollout's advantage × this per version beyond --max-staleness."
    )
    sync: bool = setting(
        False,
        "Synchronous RL: every step trains rollouts sampled entirely by the policy it updates (sets "
        "max_staleness 0 and admission on; the endpoint then starts one step's rollouts per version).",
    )
    poll_s: float = setting(0.5, "How often to look for new spans, seconds.", flags=("--poll-seconds",))
    max_steps: int | None = setting(None, "Stop after this many steps in all (default: run until stopped).")
    idle_timeout_s: float | None = setting(
        None, "Stop after this many seconds without new rollouts.", flags=("--idle-timeout",)
    )
    publish_url: str | None = setting(
        None,
        "Sampling endpoint (tinkertrace serve) to POST each new version to /admin/policy; without it, "
        "serve --watch-checkpoints LOG_DIR/checkpoints.jsonl picks them up.",
    )
    publish_token: str | None = setting(None, "The endpoint's admin token.", envvar="TINKERTRACE_ADMIN_TOKEN")
    workers: int = setting(
        2,
        "With environments that name an agent (--config): agent worker processes to start; each runs "
        "two groups at a time (each of one environment), spans to a collector this command starts.",
    )
    max_seconds: float | None = setting(None, "Stop after this many seconds.")
    worker_python: str | None = setting(
        None,
        "The agent workers' Python interpreter (an environment of their own; relative to the config file); "
        "default: this one.",
        cli=False,
    )
    sample_url: str | None = setting(
        None,
        "With agents: they sample from this OpenAI-compatible server (…/v1) instead of the endpoint this "
        "command starts (new versions reach it only through --publish-url).",
    )
    inflight: InflightMode = setting(
        "keep-cache", "With agents (--config), the endpoint this command starts. " + INFLIGHT_HELP
    )
    admission: bool = setting(
        True,
        "With --publish-url: tell the endpoint how many rollouts each step consumes, so it starts a new "
        "rollout only while it will be trained within --max-staleness versions (agents wait instead of "
        "sampling rollouts that would be dropped as stale).",
    )
    untrainable_warn_groups: int = setting(
        4,
        "Warn (console, log, LOG_DIR/warnings.jsonl) once this many groups in a row could not be trained: "
        "every reward the same, no reward, or no token ids; the warning names the rewards seen, the share "
        "of replies cut by the reply cap, and what to try.",
    )
    untrainable_warn_s: float = setting(
        60.0,
        "Or warn once the first of those groups was seen this many seconds ago.",
        flags=("--untrainable-warn-seconds",),
    )
    untrainable_repeat_s: float = setting(
        300.0,
        "While still no group trains, warn again this often, seconds.",
        flags=("--untrainable-repeat-seconds",),
    )
    untrainable_give_up_groups: int | None = setting(
        64,
        "With --max-steps: end with an error after this many groups in a row could not be trained (without "
        "--max-steps the run keeps going and keeps warning).",
    )
    untrainable_give_up_s: float | None = setting(
        600.0,
        "With --max-steps: end with an error also this many seconds after the first of those groups, once "
        "--untrainable-warn-groups of them were seen.",
        flags=("--untrainable-give-up-seconds",),
    )

    def validate(self) -> FollowSettings:
        """Check ranges (and apply ``sync``); returns self."""
        if self.sync:
            self.max_staleness, self.admission = 0, True
        checks = [
            (self.group_size >= 1, "group_size must be at least 1"),
            (self.group_timeout_s >= 0, "group_timeout_s must be 0 or more"),
            (self.max_staleness is None or self.max_staleness >= 0, "max_staleness must be 0 or more"),
            (0 < self.staleness_decay <= 1, "staleness_decay must be in (0, 1]"),
            (self.staleness_cap >= 1, "staleness_cap must be at least 1"),
            (self.poll_s > 0, "poll_s must be positive"),
            (self.max_steps is None or self.max_steps >= 1, "max_steps must be at least 1"),
            (self.workers >= 1, "workers must be at least 1"),
            (self.max_seconds is None or self.max_seconds > 0, "max_seconds must be positive"),
            (self.untrainable_warn_groups >= 1, "untrainable_warn_groups must be at least 1"),
            (
                self.untrainable_warn_s > 0 and self.untrainable_repeat_s > 0,
                "untrainable_warn_s and untrainable_repeat_s must be positive",
            ),
            (
                self.untrainable_give_up_groups is None or self.untrainable_give_up_groups >= 1,
                "untrainable_give_up_groups must be at least 1",
            ),
            (
                self.untrainable_give_up_s is None or self.untrainable_give_up_s > 0,
                "untrainable_give_up_s must be positive",
            ),
            *check_choices(self),
        ]
        raise_problems(checks, "invalid follow settings")
        return self


def make_follow_options(file: Path | None = None, overrides: dict[str, Any] | None = None) -> FollowSettings:
    """Defaults, updated by the ``follow`` table of the config ``file``, then by ``overrides``; a
    ``worker_python`` from the file is relative to it."""
    options = load(FollowSettings, file, overrides, section="follow", flat=False, what="option")
    if file is not None and options.worker_python:  # a file-only setting
        # absolute, not resolved: a virtualenv's python is a symlink, and resolving it leaves the env
        options.worker_python = os.path.normpath(Path(file).parent.absolute() / options.worker_python)
    return options


@dataclass
class StackSettings:
    """Where the local stack's things go and how its pieces are started."""

    out: Path
    model: str = DEMO_MODEL
    roll_seconds: float = 0.2  # collector Parquet roll: a rollout is buildable this soon after it ends
    export_delay_s: float = 0.05  # the agents' span export delay
    group_size: int = 8
    max_tokens: int = REPLY_TOKENS  # the endpoint's cap for requests that set none (the demo: its task's)
    agent_module: str = "tinkertrace.online.demo_agent"
    worker_python: str = sys.executable  # the interpreter of the agent workers (their own env)
    worker_env: dict[str, str] = field(default_factory=dict)  # extra environment variables of the workers
    worker_args: tuple[str, ...] = ()  # extra command-line arguments of the workers
    model_path: str | None = (
        None  # sampler weights the endpoint starts with (a resumed run's), else the model's
    )
    policy_version: int = 0  # the version those weights are served as
    inflight: InflightMode = "keep-cache"  # how running requests meet newly published weights

    @property
    def spans_dir(self) -> Path:
        return self.out / "spans"

    @property
    def agents_dir(self) -> Path:
        return self.out / "agents"

    @property
    def engine_dir(self) -> Path:
        return self.out / "engine"


DemoTaskName = Literal["identity", "addition"]


@dataclass(frozen=True)
class DemoTaskPreset:
    """A demo task: its agent worker module (whose ``DEMO_TASK`` is the task), what the live view says
    it is, and the settings chosen by experiment for it (see docs/online.md)."""

    agent_module: str
    goal: str
    steps: int
    max_seconds: float
    learning_rate: float
    max_tokens: int


DEMO_TASKS: dict[str, DemoTaskPreset] = {
    # the built-in, randomly initialised model learns one sentence character by character
    "identity": DemoTaskPreset(
        "tinkertrace.online.demo_agent", "reply [cyan]'I am tinkertrace.'[/]", 60, 150.0, 3e-3, 20
    ),
    # a pretrained chat model (SmolLM2-135M-Instruct) learns to answer a sum with only the number
    "addition": DemoTaskPreset(
        "tinkertrace.online.addition_agent", "answer [cyan]'What is a + b?'[/] with only the number",
        12, 900.0, 5e-4, 12,
    ),
}  # fmt: skip


def _per_task(name: str) -> str:
    """``"identity 60, addition 16"``: a preset setting's value per task, for help texts."""
    return ", ".join(f"{task} {getattr(preset, name):g}" for task, preset in DEMO_TASKS.items())


@dataclass
class DemoSettings:
    """The demo's knobs. Each task's defaults were chosen by experiment so the reward rises steadily
    on 2 cores (see docs/online.md); a setting left unset takes its task's value."""

    out: Path = setting(help="Output folder.", cli=False)
    model: str = setting(
        StackSettings.model,
        "Model to train: tinkertrace/tiny-chat:nano|small|base (built in), smollm2-135m-instruct, a .gguf "
        "file or a Hugging Face folder.",
    )
    task: DemoTaskName | None = setting(
        None,
        "What the agents are asked: identity (learn to reply 'I am tinkertrace.') or addition (answer "
        "'What is a + b?' with only the number). Default: identity on the built-in model, addition on "
        "any other.",
    )
    steps: int | None = setting(
        None, f"Training steps to run, each publishes a new policy (default: {_per_task('steps')})."
    )
    workers: int = setting(2, "Concurrent agent worker processes.")
    max_seconds: float | None = setting(
        None,
        "Stop training after this many seconds even if --steps is not reached (default: "
        f"{_per_task('max_seconds')}).",
    )
    learning_rate: float | None = setting(
        None, f"Adam learning rate of the LoRA weights (default: {_per_task('learning_rate')})."
    )
    lora_rank: int = setting(16, "LoRA rank.", cli=False)
    loss: Literal["ppo", "importance_sampling"] = setting(
        "ppo", "Policy-gradient loss: ppo (clipped ratio) or importance_sampling."
    )
    group_size: int = setting(8, "Rollouts per question, one GRPO group.")
    groups_per_batch: int = setting(4, "Groups per training step.", cli=False)
    max_tokens: int | None = setting(None, "Longest reply, tokens (default: the task's).", cli=False)
    max_staleness: int = setting(1, "Rollouts sampled more than N versions ago are not trained.", cli=False)
    staleness_mode: StalenessMode = setting(
        "drop", "What follow mode does with stale rollouts: drop, correct or downweight (see train --follow)."
    )
    num_substeps: int = setting(
        TrainSettings.num_substeps,
        "Optimiser steps per training step (train --num-substeps); 2-4 make correct mode's clip act.",
    )
    sync: bool = setting(False, "Synchronous RL: each step trains only rollouts of the policy it updates.")
    inflight: InflightMode = setting("keep-cache", INFLIGHT_HELP)
    admission: bool = setting(
        True, "The endpoint starts only rollouts the trainer will take within max_staleness.", cli=False
    )
    roll_seconds: float = setting(StackSettings.roll_seconds, "The collector's file roll.", cli=False)
    export_delay_s: float = setting(StackSettings.export_delay_s, "The agents' export delay.", cli=False)
    seed: int = setting(0, "Seed of the LoRA initialisation and of the questions the agents draw.")
    heldout_samples: int = setting(
        8,
        "Times each held-out question (one training never asks) is sampled for the held-out score "
        "measured before the first step and after the last; 0 skips it.",
    )

    def __post_init__(self) -> None:
        """Fill the settings left unset from the task's preset."""
        if self.task is None:
            self.task = "identity" if self.model.startswith(BUILTIN_MODEL) else "addition"
        preset = DEMO_TASKS.get(self.task)
        if preset is None:
            return  # validate() names the bad task
        for name in ("steps", "max_seconds", "learning_rate", "max_tokens"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(preset, name))

    @property
    def preset(self) -> DemoTaskPreset:
        """The task's agent module, goal and default settings."""
        return DEMO_TASKS[str(self.task)]

    def validate(self) -> DemoSettings:
        """Check ranges and choices; returns self."""
        checks = [
            (self.task in DEMO_TASKS, f"task must be one of {', '.join(DEMO_TASKS)}"),
            ((self.steps or 0) >= 1, "steps must be at least 1"),
            (self.workers >= 1, "workers must be at least 1"),
            (self.group_size >= 2, "group_size must be at least 2"),
            ((self.max_seconds or 0) > 0, "max_seconds must be positive"),
            ((self.max_tokens or 0) >= 1, "max_tokens must be at least 1"),
            (self.heldout_samples >= 0, "heldout_samples must be 0 or more"),
            (self.num_substeps >= 1, "num_substeps must be at least 1"),
            *check_choices(self),
        ]
        raise_problems(checks, "invalid demo settings")
        return self
