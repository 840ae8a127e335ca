"""Training configuration: one dataclass, loadable from a YAML/TOML file with command-line overrides.

Precedence: defaults < config file < command-line overrides. A file holds the fields flat or under a
``train`` table/mapping; dashes in keys are read as underscores. Unknown keys and bad values raise
:class:`ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types as pytypes
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from tinkertrace.tokenizer import BUILTIN_MODEL
from tinkertrace.training.advantages import ADVANTAGE_MODES
from tinkertrace.training.datums import LOSS_FUNCTIONS
from tinkertrace.training.errors import ConfigError, raise_problems


@dataclass
class TrainConfig:
    """Everything one training run needs. See ``tinkertrace train --help`` for each field's meaning."""

    source: Path | None = None
    backend: Literal["local", "tinker"] = "local"
    model: str = BUILTIN_MODEL
    epochs: int = 1
    groups_per_batch: int = 8
    learning_rate: float = 1e-4
    lora_rank: int = 16
    loss: Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"] = "importance_sampling"
    loss_config: dict[str, float] = field(default_factory=dict)
    advantage: Literal["group", "std", "none"] = "group"
    group_by: Literal["task", "task+agent"] = "task"
    remove_constant_reward_groups: bool = True
    max_tokens_per_datum: int = 4096
    log_dir: Path = Path("runs/train")
    save_every: int = 10
    resume: bool = False
    seed: int = 0
    shuffle: bool = True
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    engine_dir: Path | None = None
    wandb_project: str | None = None
    wandb_run_name: str | None = None

    def validate(self) -> TrainConfig:
        """Check value ranges and choices; returns self."""
        checks = [
            (self.epochs >= 1, "epochs must be at least 1"),
            (self.groups_per_batch >= 1, "groups_per_batch must be at least 1"),
            (self.learning_rate > 0, "learning_rate must be positive"),
            (self.lora_rank >= 0, "lora_rank must be 0 (full fine-tuning, local engine only) or more"),
            (self.max_tokens_per_datum >= 1, "max_tokens_per_datum must be at least 1"),
            (self.save_every >= 0, "save_every must be 0 (only at the end) or more"),
            (self.loss in LOSS_FUNCTIONS, f"loss must be one of {', '.join(LOSS_FUNCTIONS)}"),
            (self.advantage in ADVANTAGE_MODES, f"advantage must be one of {', '.join(ADVANTAGE_MODES)}"),
            (self.group_by in ("task", "task+agent"), "group_by must be 'task' or 'task+agent'"),
            (self.backend in ("local", "tinker"), "backend must be 'local' or 'tinker'"),
        ]
        raise_problems(checks, "invalid training config")
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (paths as strings)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _coerce(key: str, value: Any, kind: Any) -> Any:
    origin, args = get_origin(kind), get_args(kind)
    if origin in (typing.Union, pytypes.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, args))}")
        return value
    if origin is dict:
        if isinstance(value, str):
            value = parse_key_values([value], what=key)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of name to number, got {value!r}")
        return {str(k): _coerce(f"{key}.{k}", v, args[1]) for k, v in value.items()}
    try:
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise TypeError
        if kind in (int, float) and isinstance(value, bool):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a valid {getattr(kind, '__name__', kind)}") from None


def parse_key_values(items: list[str], what: str = "loss_config") -> dict[str, float]:
    """``["clip_low_threshold=0.8", ...]`` → ``{"clip_low_threshold": 0.8}``; comma-separated also works."""
    out: dict[str, float] = {}
    for item in items:
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, raw = part.partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"{what}: expected key=value, got {part!r}")
            try:
                out[name.strip()] = float(raw)
            except ValueError:
                raise ConfigError(
                    f"{what}: value of {name.strip()!r} must be a number, got {raw!r}"
                ) from None
    return out


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings in a ``.yaml``/``.yml``/``.toml`` file (flat, or under a ``train`` key)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {path} must end in .yaml, .yml or .toml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    if isinstance(data.get("train"), dict):
        data = data["train"]
    return data


def make_config(file: Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, updated by ``file`` then by ``overrides`` (entries that are None are ignored)."""
    kinds = _field_types()
    merged: dict[str, Any] = {}
    layers = [
        read_config_file(file) if file else {},
        {k: v for k, v in (overrides or {}).items() if v is not None},
    ]
    for origin, layer in zip(("config file", "option"), layers, strict=True):
        for raw_key, value in layer.items():
            key = str(raw_key).replace("-", "_")
            if key not in kinds:
                raise ConfigError(f"unknown {origin} setting {raw_key!r}; known: {', '.join(sorted(kinds))}")
            value = _coerce(key, value, kinds[key])
            merged[key] = {**merged[key], **value} if isinstance(value, dict) and key in merged else value
    return TrainConfig(**merged).validate()
