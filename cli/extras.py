"""Commands name the optional extra they need (``tinkertrace.extras``): a missing one is one clear line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from tinkertrace.extras import MissingExtraError, require

F = TypeVar("F", bound=Callable[..., Any])


def fail(exc: Exception) -> typer.Exit:
    """Print ``error: <exc>`` on stderr; the Exit(2) to raise (a user's mistake, one line, no trace)."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


def needs_extra(extra: str, command: str) -> Callable[[F], F]:
    """Wrap a command: check ``extra`` before it runs, and turn a :class:`MissingExtraError` raised
    anywhere inside it (e.g. the local engine without torch) into an error line and exit code 2."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                require(extra, f"`tinkertrace {command}`")
                return function(*args, **kwargs)
            except MissingExtraError as exc:
                raise fail(exc) from None

        return run  # type: ignore[return-value]

    return wrap
