"""`--help` of the real CLI with no terminal attached: full width, one option's help on one line,
docstring paragraphs reflowed (issue 51)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinkertrace.cli.help_layout import HELP_WIDTH, reflow
from tinkertrace.cli.main import app

TINKERTRACE = str(Path(sys.executable).with_name("tinkertrace"))  # the installed command


def _help(*command: str, columns: str | None = None) -> list[str]:
    """The lines `tinkertrace COMMAND --help` prints with stdin, stdout and stderr not terminals."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [TINKERTRACE, *command, "--help"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ((), "OTLP traces and logs (HTTP and gRPC) and write them durably to hive-partitioned Parquet."),
        (("train",), "Groups (tasks) per optimiser step; all of a group's rollouts go together."),
        (("serve",), "Record every call served as spans written to this folder (Parquet)."),
        (("collector",), "OTLP/HTTP port (POST /v1/traces, /v1/logs). [default: 4318]"),
        (("spans", "query"), "SQL over the views spans, llm_calls, rewards and rollouts."),
    ],
)
def test_piped_help_keeps_an_options_help_on_one_line(command: tuple[str, ...], text: str) -> None:
    lines = _help(*command)
    assert [line for line in lines if text in line], f"{text!r} is wrapped:\n" + "\n".join(lines)
    assert max(len(line) for line in lines) == HELP_WIDTH


def test_columns_wins_over_the_piped_width() -> None:
    lines = _help("train", columns="100")
    assert max(len(line) for line in lines) == 100


def test_each_run_reads_its_own_environment() -> None:
    """The width is decided when the command line runs, not when the app is imported."""
    for columns in ("100", "180"):
        env = {"COLUMNS": columns, "TERMINAL_WIDTH": None}
        result = CliRunner().invoke(app, ["train", "--help"], env=env)
        assert max(len(line) for line in result.output.splitlines()) == int(columns)


def test_a_docstrings_paragraphs_reflow_and_stay_apart() -> None:
    lines = [line.strip() for line in _help("train")]
    description = lines[lines.index("Usage: tinkertrace train [OPTIONS] [SOURCE]") + 1 :]
    description = description[: next(i for i, line in enumerate(description) if line.startswith("╭"))]
    paragraphs = [p.strip() for p in " ".join(line or "\n" for line in description).split("\n") if p.strip()]
    assert [p.split()[:2] for p in paragraphs] == [["Train", "the"], ["Each", "step"], ["With", "an"]]
    assert any("Tinker Datums (advantage on sampled tokens only), and runs" in line for line in description)


def test_reflow_keeps_a_paragraph_marked_as_written() -> None:
    text = """First line
    goes on.

    \b
    - one
    - two
    """
    assert reflow(text) == "First line goes on.\n\n\b\n- one\n- two"
