"""A path that does not exist, or an object-store URL, is one clear error (exit 2), never an empty store:
each command that reads a spans (or trajectories, or run) folder, through the real CLI in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MISSING = "/no/such/folder"
URLS = ("s3://tt/spans", "gs://tt/spans")

COMMANDS: dict[str, list[str]] = {
    "spans query": ["spans", "query", "{path}", "select count(*) from spans"],
    "spans stats": ["spans", "stats", "{path}"],
    "spans compact": ["spans", "compact", "{path}"],
    "build-trajectories": ["build-trajectories", "{path}", "-o", "{out}"],
    "train": ["train", "{path}", "--log-dir", "{out}"],
    "train --follow": ["train", "--follow", "{path}", "--log-dir", "{out}"],
    "ui": ["ui", "{path}", "--port", "0"],
}
WHAT = {
    "spans query": "spans folder",
    "spans stats": "spans folder",
    "spans compact": "spans folder",
    "build-trajectories": "spans folder",
    "train": "training source",
    "train --follow": "spans folder to follow",
    "ui": "folder",
}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # a command that read a missing folder as empty could wait (train --follow) or serve (ui) forever
    return subprocess.run(
        [sys.executable, "-m", "tinkertrace.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _args(command: str, path: str, tmp_path: Path) -> list[str]:
    return [a.format(path=path, out=tmp_path / "out") for a in COMMANDS[command]]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_missing_folder_is_an_error_naming_it(command: str, tmp_path: Path) -> None:
    result = _run(_args(command, MISSING, tmp_path), tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: {WHAT[command]} {MISSING} does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert "count_star" not in result.stdout  # no empty result printed


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_object_store_url_is_not_supported_yet(command: str, url: str, tmp_path: Path) -> None:
    result = _run(_args(command, url, tmp_path), tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    scheme = url.split("://")[0]
    assert f"error: {WHAT[command]} {url}: object-store URLs ({scheme}://...) are not supported yet" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / f"{scheme}:").exists()  # nothing made of the URL as a local folder


@pytest.mark.parametrize("option", ["--spans-dir", "--out"])
def test_eval_refuses_an_object_store_url_to_write_to(option: str, tmp_path: Path) -> None:
    result = _run(["eval", "agent:run", "--tasks", "tasks:load", option, "s3://tt/eval"], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "s3://tt/eval: object-store URLs (s3://...) are not supported yet" in result.stderr


def test_an_existing_file_is_not_a_spans_folder(tmp_path: Path) -> None:
    file = tmp_path / "spans.txt"
    file.write_text("x")
    result = _run(["spans", "stats", str(file)], tmp_path)
    assert result.returncode == 2
    assert f"error: spans folder {file} is a file, not a folder" in result.stderr


def test_an_existing_empty_folder_is_an_empty_store_with_a_note(tmp_path: Path) -> None:
    empty = tmp_path / "spans"
    empty.mkdir()
    result = _run(["spans", "query", str(empty), "select count(*) AS n from spans", "-f", "csv"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["n", "0"]
    assert f"note: no span files under {empty}" in result.stderr
