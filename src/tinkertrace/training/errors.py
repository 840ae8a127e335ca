"""Errors of the training data and backends; each is a :class:`~tinkertrace.settings.UserError`, which
the CLI reports as one clear message (no traceback). Configuration errors are the settings module's."""

from __future__ import annotations

from tinkertrace.settings import UserError


class DataError(UserError):
    """The training source is missing, empty, of the wrong shape, or holds unusable rows."""


class BackendError(UserError):
    """The training backend cannot be used: missing API key, unreachable service, unknown model."""
