"""How `--help` is laid out: the width when no terminal is attached, and paragraphs that reflow.

With no terminal on stdin, stdout or stderr (a CI log, a captured subprocess, a job without a tty), rich
falls back to 80 columns, where the option table leaves each help text a narrow column of three-word
lines. There help is :data:`HELP_WIDTH` wide instead. A terminal keeps its own width (so `--help | less`
fits the screen it is read on), and ``COLUMNS`` or typer's ``TERMINAL_WIDTH`` win when set.

A command's docstring is wrapped for the source file; :func:`reflow` joins each paragraph's lines so
rich wraps them at the console's width, keeping the blank lines between paragraphs (and a paragraph
marked with click's ``\\b`` as written).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

import typer
from typer import rich_utils
from typer.core import TyperGroup

HELP_WIDTH = 160
"""Columns of help with no terminal: the widest option table (train's: two flag columns and a type
take 80) leaves its help column about 76 wide, a line of prose; wider would overflow the common
log viewers and side-by-side views."""


def help_width(environ: Mapping[str, str] = os.environ) -> int | None:
    """The console width for help: :data:`HELP_WIDTH` when no terminal is attached and no width is
    set in the environment; else None, for rich's own choice (the terminal's, or ``COLUMNS``)."""
    if (width := environ.get("TERMINAL_WIDTH", "")).isdigit():  # typer's own setting
        return int(width)
    if environ.get("COLUMNS") or any(os.isatty(fd) for fd in (0, 1, 2)):
        return None
    return HELP_WIDTH


def reflow(text: str) -> str:
    """``text`` (a docstring) with each paragraph's lines joined into one; paragraphs that start
    with ``\\b`` are kept as written."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)


class HelpLayoutGroup(TyperGroup):
    """The app's command group: each run sets the help width (typer's console reads
    ``rich_utils.MAX_WIDTH``) from that run's environment and streams."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        rich_utils.MAX_WIDTH = help_width()
        return super().main(*args, **kwargs)


def reflow_help(app: typer.Typer) -> None:
    """Reflow the help paragraphs of every command of ``app`` (and of its sub-apps)."""
    for command in app.registered_commands:
        text = command.help if command.help is not None else inspect.getdoc(command.callback)
        if text:
            command.help = reflow(text)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)
