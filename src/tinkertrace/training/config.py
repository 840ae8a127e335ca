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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tinkertrace.builder.options import GroupBy
from tinkertrace.builtin import BUILTIN_MODEL
from tinkertrace.settings import check_choices, load, setting
from tinkertrace.training.backends import Backend
from tinkertrace.training.errors import raise_problems

Loss = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
AdvantageMode = Literal["group", "std", "none"]


@dataclass
class TrainConfig:
    """Everything one training run needs; each field's help is its documentation."""

    source: Path | None = setting(
        None,
        "Trajectories (a .parquet file, or a folder holding trajectories.parquet or trajectory files) or "
        "a spans folder, which is built into trajectories first. May also come from --config.",
        argument=True,
    )
    backend: Backend = setting(
        "local", "'local' (the engine on this machine) or 'tinker' (hosted; needs TINKER_API_KEY)."
    )
    model: str = setting(
        BUILTIN_MODEL,
        "Base model: 'tinkertrace/tiny-chat[:nano|small|base]' (built in), 'smollm2-135m-instruct' (the "
        "smollm2 extra), a .gguf file, a local Hugging Face folder, "
        "or a Tinker model name such as Qwen/Qwen3-8B.",
    )
    epochs: int = setting(1, "Passes over the data.")
    groups_per_batch: int = setting(
        8, "Groups (tasks) per optimiser step; all of a group's rollouts go together."
    )
    learning_rate: float = setting(1e-4, "Adam learning rate.")
    lora_rank: int = setting(16, "LoRA rank; 0 trains all weights (local engine only).")
    loss: Loss = setting(
        "importance_sampling",
        "Loss: importance_sampling, ppo, cispo, dro, or cross_entropy (imitates the sampled tokens).",
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
        Path("runs/train"), "Folder for metrics.jsonl, checkpoints.jsonl and config.json."
    )
    save_every: int = setting(10, "Save a checkpoint every N steps (0 = only at the end).")
    resume: bool = setting(False, "Continue from the last checkpoint in --log-dir.", flags=("--resume",))
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
        None, "Also log to this Weights & Biases project (needs the wandb package; or $WANDB_PROJECT)."
    )
    wandb_run_name: str | None = setting(None, "The Weights & Biases run name.", cli=False)

    def validate(self) -> TrainConfig:
        """Check value ranges and choices; returns self."""
        checks = [
            (self.epochs >= 1, "epochs must be at least 1"),
            (self.groups_per_batch >= 1, "groups_per_batch must be at least 1"),
            (self.learning_rate > 0, "learning_rate must be positive"),
            (self.lora_rank >= 0, "lora_rank must be 0 (full fine-tuning, local engine only) or more"),
            (self.max_tokens_per_datum >= 1, "max_tokens_per_datum must be at least 1"),
            (self.save_every >= 0, "save_every must be 0 (only at the end) or more"),
            *check_choices(self),
        ]
        raise_problems(checks, "invalid training config")
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (paths as strings)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}


def make_config(file: Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, updated by ``file`` (flat, or its ``train`` table), then by ``overrides`` (None: unset)."""
    return load(TrainConfig, file, overrides, section="train", what="option")
