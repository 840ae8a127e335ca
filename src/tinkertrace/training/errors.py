"""Errors the training command reports as one clear message (no traceback)."""

from __future__ import annotations

from collections.abc import Iterable


class TrainingError(Exception):
    """Base class: a problem the user can fix, reported by the CLI as a single message."""


class ConfigError(TrainingError, ValueError):
    """A bad configuration value, unknown key or unreadable config file."""


class DataError(TrainingError):
    """The training source is missing, empty, of the wrong shape, or holds unusable rows."""


class BackendError(TrainingError):
    """The training backend cannot be used: missing API key, unreachable service, unknown model."""


def raise_problems(checks: Iterable[tuple[bool, str]], what: str) -> None:
    """Raise one :class:`ConfigError` ``"<what>: <problem>; <problem>"`` naming every failed check."""
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise ConfigError(f"{what}: " + "; ".join(problems))
