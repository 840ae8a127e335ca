"""Commands name the optional extra they need (``tinkertrace.extras``): a missing one is one clear line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from tinkertrace.extras import MissingExtraError, require

F = TypeVar("F", bound=Callable[..., Any])


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
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None

        return run  # type: ignore[return-value]

    return wrap
