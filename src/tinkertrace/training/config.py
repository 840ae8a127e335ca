"""Training configuration: one dataclass, loadable from a YAML/TOML file with command-line overrides.

Precedence: defaults < config file < command-line overrides. A file holds the fields flat or under a
``train`` table/mapping; dashes in keys are read as underscores. Unknown keys and bad values raise
:class:`ConfigError` naming the key.

Every field is declared once, with its help text, by :func:`tinkertrace.settings.setting`;
``tinkertrace train`` makes its options from these fields, so a new setting is written only here.
This module stays light (no torch, no tokenizer): the command line imports it to build its help.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tinkertrace.builder.options import GroupBy
from tinkertrace.models.builtin import BUILTIN_MODEL
from tinkertrace.ors import ORS_AGENT, ORS_TASKS
from tinkertrace.settings import ConfigError, check_choices, coerce, load, raise_problems, setting
from tinkertrace.training.backends import Backend

Loss = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
AdvantageMode = Literal["group", "std", "none"]
Reduction = Literal["sum", "mean", "max", "min", "last"]

REPLY_TOKENS = 512
"""An environment's reply cap when it sets no ``max_tokens``: room for a tool call with its arguments
(the demo's 12-20 tokens fit no call); the engine cuts each reply to what the model's context leaves
after its prompt."""


@dataclass
class Environment:
    """One training environment of a multi-environment run (the ``environments`` list of a config
    file): its agent and tasks, how its rollouts are sampled, and how they become training rows.

    Its rollouts' task ids start with ``NAME/`` (:func:`tinkertrace.training.environments.group_task_id`),
    which is how trajectories are told apart by environment."""

    name: str = setting(help="The environment's name (no '/'): the first part of its rollouts' task ids.")
    agent: str | None = setting(
        None, "The agent: 'path/to/file.py:function' (relative to the config file) or 'module:function'."
    )
    tasks: str | None = setting(None, "The task source, a function returning task dicts with an 'id'.")
    openreward: str | None = setting(
        None,
        "An OpenReward (ORS) environment: a URL (http://HOST:PORT/NAME), a NAME on $OPENREWARD_URL's server, "
        "or a hosted Owner/Name; its tasks come from the server and the built-in ORS agent plays it.",
    )
    max_turns: int = setting(8, "OpenReward environments: most policy calls per episode (then truncated).")
    split: str = setting("train", "The task split the agents draw from.")
    shuffle: bool = setting(True, "Shuffle the split's tasks (seeded) before num_samples takes the first.")
    num_samples: int | None = setting(None, "Use this many of the split's tasks (default: all).")
    splits: dict[str, Any] = setting(
        help="The split as a mapping {SPLIT: {shuffle, num_samples}} (one split): sets split, shuffle, "
        "num_samples.",
        default_factory=dict,
    )
    group_size: int = setting(4, "Rollouts per task: one GRPO group.", aliases=("num_rollouts",))
    weight: float = setting(1.0, "The environment's share of each step's groups (relative to the others).")
    temperature: float = setting(1.0, "Sampling temperature passed to the agent.")
    max_tokens: int | None = setting(
        None,
        f"Longest reply, tokens, passed to the agent. Unset: {REPLY_TOKENS} (room for a tool call), which "
        "the OpenReward agent asks for and the endpoint train starts gives requests that set none. A reply "
        "is also cut to the room the model's context leaves after its prompt.",
    )
    agent_kwargs: dict[str, Any] = setting(
        help="Further keyword arguments for the agent.", default_factory=dict
    )
    build: dict[str, Any] = setting(
        help="Build options of its rollouts (tinkertrace build's settings: agent, group_by, reward_policy…).",
        default_factory=dict,
    )
    reward_reduction: Reduction | None = setting(
        None,
        "A trajectory's reward from its per-call rewards: sum, mean, max, min or last "
        "(default: the builder's reward).",
    )
    nonterminal_reward: float | None = setting(
        None, "The reward of rollouts that ended without finishing (they emitted a 'truncated' reward)."
    )
    max_failing_rollouts: int | None = setting(
        None,
        "Drop a group when more of its rollouts than this failed (default: keep it, failed ones left out).",
    )
    reward_per_call: bool = setting(
        False, "A one-call trajectory keeps its own call's reward (parallel solvers), not the agent's sum."
    )

    def __post_init__(self) -> None:
        """Read ``splits`` into split, shuffle and num_samples; an OpenReward environment gets the
        built-in ORS agent and task source."""
        if self.splits:
            if len(self.splits) != 1:
                raise ConfigError(
                    f"{self.name}: splits names {len(self.splits)} splits; give the one to train on"
                )
            ((self.split, options),) = self.splits.items()
            options = dict(options or {})
            unknown = sorted(set(options) - {"shuffle", "num_samples"})
            if unknown:
                raise ConfigError(
                    f"{self.name}: unknown split setting(s) {', '.join(unknown)}; known: num_samples, shuffle"
                )
            self.shuffle = coerce("shuffle", options.get("shuffle", self.shuffle), bool)
            samples = options.get("num_samples", self.num_samples)
            self.num_samples = None if samples is None else coerce("num_samples", samples, int)
        if self.openreward and self.agent is None and self.tasks is None:
            self.agent, self.tasks = ORS_AGENT, ORS_TASKS

    @classmethod
    def keyed(cls, key: str, entry: Any) -> dict[str, Any]:
        """An entry of an ``environments`` mapping (that system's form, keyed by environment): an
        OpenReward environment named by its key, unless the entry names its own agent or tasks."""
        entry = dict(entry or {})
        if {"agent", "tasks", "openreward"} & set(entry):
            return {"name": key, **entry}
        name = key.rstrip("/").rsplit("/", 1)[-1] if "://" in key else key.replace("/", ".")
        return {"name": name, "openreward": key, **entry}

    def validate(self) -> Environment:
        """Check names and ranges; returns self."""
        checks = [
            (self.max_turns >= 1, f"{self.name}: max_turns must be at least 1"),
            (
                self.num_samples is None or self.num_samples >= 1,
                f"{self.name}: num_samples must be at least 1",
            ),
            (
                bool(self.name) and "/" not in self.name,
                f"environment name {self.name!r} must be non-empty, no '/'",
            ),
            (self.group_size >= 1, f"{self.name}: group_size must be at least 1"),
            (self.weight > 0, f"{self.name}: weight must be positive"),
            (self.temperature >= 0, f"{self.name}: temperature must be 0 or more"),
            (
                self.nonterminal_reward is None or math.isfinite(self.nonterminal_reward),
                f"{self.name}: nonterminal_reward must be a finite number",
            ),
            (self.max_tokens is None or self.max_tokens >= 1, f"{self.name}: max_tokens must be at least 1"),
            (
                self.max_failing_rollouts is None or self.max_failing_rollouts >= 0,
                f"{self.name}: max_failing_rollouts must be 0 or more",
            ),
            (
                (self.agent is None) == (self.tasks is None),
                f"{self.name}: give both agent and tasks, or neither",
            ),
            *((ok, f"{self.name}: {problem}") for ok, problem in check_choices(self)),
        ]
        raise_problems(checks, "invalid environment")
        return self


@dataclass
class TrainSettings:
    """Everything one training run needs; each field's help is its documentation."""

    source: Path | None = setting(
        None,
        "Trajectories (a .parquet file, or a folder holding trajectories.parquet or trajectory files) or "
        "a spans folder, which is built into trajectories first. May also come from --config.",
        argument=True,
    )
    backend: Backend = setting(
        "auto",
        "'local' (the engine on this machine), 'tinker' (hosted; needs TINKER_API_KEY), or 'auto': tinker "
        "when TINKER_API_KEY is set, else local.",
    )
    model: str = setting(
        BUILTIN_MODEL,
        aliases=("model_name",),
        help="Base model: 'tinkertrace/tiny-chat[:nano|small|base]' (built in), 'smollm2-135m-instruct' (the "
        "smollm2 extra), a .gguf file, a local Hugging Face folder, "
        "or a Tinker model name such as Qwen/Qwen3-8B.",
    )
    epochs: int = setting(1, "Passes over the data.")
    groups_per_batch: int = setting(
        8,
        "Groups (tasks) per optimiser step; all of a group's rollouts go together.",
        aliases=("batch_size",),
    )
    learning_rate: float = setting(1e-4, "Adam learning rate.")
    num_substeps: int = setting(
        1,
        "Optimiser steps per training step: the batch is split into this many minibatches, each one "
        "forward_backward + optim_step (the cookbook's num_substeps). With ppo or cispo the clip then "
        "bounds the later minibatches' updates against the logprobs the step started from.",
    )
    lora_rank: int = setting(16, "LoRA rank; 0 trains all weights (local engine only).")
    loss: Loss = setting(
        "importance_sampling",
        "Loss: importance_sampling, ppo, cispo, dro, or cross_entropy (imitates the sampled tokens).",
        aliases=("loss_fn",),
    )
    loss_config: dict[str, float] = setting(
        help="Loss setting key=value, repeatable: e.g. clip_low_threshold=0.8 clip_high_threshold=1.2 "
        "(ppo, cispo) or beta=0.05 (dro).",
        default_factory=dict,
    )
    advantage: AdvantageMode = setting(
        "group",
        "group: reward minus group mean; std: also divided by the group std; none: the raw reward.",
    )
    group_by: GroupBy = setting("task", "Group key for advantages: task or task+agent.")
    remove_constant_reward_groups: bool = setting(
        True,
        "Drop groups whose rollouts all got the same reward (they carry no signal).",
        flags=("--remove-constant-reward-groups/--keep-constant-reward-groups",),
    )
    max_tokens_per_datum: int = setting(
        4096, "Longest model input per sequence; longer ones keep their first tokens."
    )
    log_dir: Path = setting(
        Path("runs/train"),
        "Folder for metrics.jsonl, checkpoints.jsonl and config.json.",
        aliases=("log_path",),
    )
    save_every: int = setting(10, "Save a checkpoint every N steps (0 = only at the end).")
    resume: bool = setting(False, "Continue from the last checkpoint in --log-dir.", flags=("--resume",))
    resume_from: str | None = setting(
        None,
        "Start from this saved training state (a state path such as tinker://RUN/weights/NAME, with its "
        "optimizer) when --log-dir holds no checkpoint yet.",
    )
    seed: int = setting(0, "Seed of the data order and the LoRA init.")
    shuffle: bool = setting(True, "Shuffle the groups each epoch (seeded).", cli=False)
    beta1: float = setting(0.9, "AdamW beta1.", cli=False)
    beta2: float = setting(0.95, "AdamW beta2.", cli=False)
    eps: float = setting(1e-8, "AdamW epsilon.", cli=False)
    weight_decay: float = setting(0.0, "AdamW weight decay.", cli=False)
    grad_clip_norm: float = setting(
        0.0, "Clip the gradient to this global norm (0 = no clipping).", cli=False
    )
    engine_dir: Path | None = setting(
        None, "Local engine checkpoint folder (default $TINKERTRACE_HOME/engine)."
    )
    wandb_project: str | None = setting(
        None,
        "Also log to this Weights & Biases project (needs the wandb package; or $WANDB_PROJECT).",
        aliases=("wandb_project_name",),
    )
    wandb_run_name: str | None = setting(None, "The Weights & Biases run name.", cli=False)
    openreward_run_name: str | None = setting(
        None,
        "Upload finished OpenReward rollouts to this OpenReward run (needs $OPENREWARD_API_KEY).",
        cli=False,
    )
    environments: list[Environment] = setting(
        help="Multi-environment training: a list of environments (name, agent, tasks, group_size, weight, "
        "sampling and reward settings; see docs/training.md).",
        cli=False,
        default_factory=list,
    )

    def validate(self) -> TrainSettings:
        """Check value ranges and choices; returns self."""
        checks = [
            (self.epochs >= 1, "epochs must be at least 1"),
            (self.groups_per_batch >= 1, "groups_per_batch must be at least 1"),
            (self.learning_rate > 0, "learning_rate must be positive"),
            (self.num_substeps >= 1, "num_substeps must be at least 1"),
            (self.lora_rank >= 0, "lora_rank must be 0 (full fine-tuning, local engine only) or more"),
            (self.max_tokens_per_datum >= 1, "max_tokens_per_datum must be at least 1"),
            (self.save_every >= 0, "save_every must be 0 (only at the end) or more"),
            *check_choices(self),
            *_unique_names(self.environments),
        ]
        raise_problems(checks, "invalid training config")
        for env in self.environments:
            env.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (paths as strings)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}


def _unique_names(environments: list[Environment]) -> list[tuple[bool, str]]:
    names = [env.name for env in environments]
    return [(names.count(n) == 1, f"environment {n!r} is listed twice") for n in sorted(set(names))]


OTHER_SECTIONS = ("follow",)  # config-file tables that other settings read (online.settings.FollowSettings)


def make_config(
    file: Path | None = None, overrides: dict[str, Any] | None = None, edits: dict[str, Any] | None = None
) -> TrainSettings:
    """Defaults, updated by ``file`` (flat, or its ``train`` table) with ``edits`` (``--set``, dotted
    keys) laid over it, then by ``overrides`` (None: unset). Environments' ``file.py:function``
    references are relative to the file."""
    config = load(
        TrainSettings, file, overrides, section="train", skip=OTHER_SECTIONS, what="option", edits=edits
    )
    if file is not None:
        for env in config.environments:
            env.agent, env.tasks = (_relative_to(Path(file).parent, ref) for ref in (env.agent, env.tasks))
    return config


def _relative_to(folder: Path, ref: str | None) -> str | None:
    """A ``file.py:function`` reference made absolute against ``folder`` (a module reference as is)."""
    if ref is None:
        return None
    module, _, attr = ref.rpartition(":")
    return f"{(folder / module).resolve()}:{attr}" if module.endswith(".py") else ref
