"""The one import namespace: ``tinkertrace.cli``, ``.collector`` and ``.schemas`` are the top-level folders,
reached through symlinks in src/tinkertrace, so the editable install is a plain path that type checkers
and editors follow (a setuptools import hook, as a package-dir remap needs, is invisible to them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tinkertrace.cli.main
import tinkertrace.collector.ingest
import tinkertrace.schemas

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("cli", "collector", "schemas")


def test_the_top_level_folders_are_the_packages_under_src() -> None:
    for name in TOP_LEVEL:
        link = ROOT / "src" / "tinkertrace" / name
        assert link.is_symlink(), f"{link} must be a symlink to the top-level {name}/"
        assert link.resolve() == ROOT / name
    # imported through src/ (the editable install's static path), and the same files as the top level
    for module, top in ((tinkertrace.cli.main, "cli"), (tinkertrace.collector.ingest, "collector")):
        file = Path(module.__file__ or "")
        assert file.parent == ROOT / "src" / "tinkertrace" / top
        assert file.resolve().parent == ROOT / top
    assert not any(name.startswith("__editable__") for name in sys.modules)  # no import hook


def test_mypy_resolves_the_remapped_packages_from_the_installed_environment(tmp_path: Path) -> None:
    """What an editor sees: the installed package and no project settings (no mypy_path)."""
    (tmp_path / "empty.toml").write_text("")

    def mypy(code: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mypy", "--config-file", "empty.toml", "--no-incremental"]
        command += ["--follow-imports=skip", "-c", code]  # find the modules, do not analyse them
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    found = mypy("import tinkertrace.cli.main, tinkertrace.collector.ingest, tinkertrace.schemas.columns")
    assert found.returncode == 0, found.stdout + found.stderr
    missing = mypy("import tinkertrace.cli.no_such_module")  # the same check does fail on a missing one
    assert missing.returncode == 1 and 'module named "tinkertrace.cli.no_such_module"' in missing.stdout
