"""docs/results.md: generated from benchmarks/results/*.json by benchmarks/results_page.py, a result marked
stale when what it measures changed after its commit, every benchmark script with a section."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


record = _load("record")
results_page = _load("results_page")

SCRIPT = '''"""Fake benchmark: times the package.

    python benchmarks/fake.py --fast
"""

MEASURES = ("src/pkg",)
'''


def git(repo: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, path: str, text: str) -> None:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    git(repo, "add", path)
    git(repo, "commit", "-q", "-m", f"change {path}")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one benchmark (measuring src/pkg), one unmeasured file and docs/."""
    git(tmp_path, "init", "-q")
    commit(tmp_path, "benchmarks/fake.py", SCRIPT)
    commit(tmp_path, "src/pkg/core.py", "x = 1\n")
    commit(tmp_path, "other/notes.txt", "a\n")
    (tmp_path / "docs").mkdir()
    return tmp_path


def measure(repo: Path, value: float = 1.5) -> dict:
    """Record a result of the fake benchmark at the repository's HEAD; its JSON."""
    result = record.Result(
        repo / "benchmarks" / "fake.py",
        ["src/pkg"],
        repo / "benchmarks" / "results",
        argv=["--fast"],
        root=repo,
    )
    result.add("step_s", value, "s", "one step")
    path = result.save()
    assert path == repo / "benchmarks" / "results" / "fake.json"
    return json.loads(path.read_text())


def section(repo: Path, stem: str) -> str:
    page = results_page.render(repo)
    return page.split(f"\n## {stem}\n", 1)[1].split("\n## ", 1)[0]


def test_a_result_is_fresh_until_what_it_measures_changes(repo: Path) -> None:
    data = measure(repo)
    assert data["commit"] == git(repo, "rev-parse", "HEAD")
    assert data["measures"] == ["benchmarks/fake.py", "src/pkg"]
    assert data["dirty"] == []
    assert data["command"].endswith("benchmarks/fake.py --fast")
    short = data["commit"][:7]
    assert f"✓ current: nothing it measures changed since {short}" in section(repo, "fake")
    commit(repo, "other/notes.txt", "b\n")  # not measured
    assert "✓ current" in section(repo, "fake")
    commit(repo, "src/pkg/core.py", "x = 2\n")
    text = section(repo, "fake")
    assert f"⚠ **stale**: src/pkg changed since {short}" in text
    assert "✓ current" not in text
    assert "| `step_s` | 1.5 | s | one step |" in text


def test_a_change_to_the_script_makes_its_result_stale(repo: Path) -> None:
    measure(repo)
    commit(repo, "benchmarks/fake.py", SCRIPT + "# faster\n")
    assert "⚠ **stale**: benchmarks/fake.py changed since" in section(repo, "fake")


def test_a_commit_unknown_to_the_repository_is_stale(repo: Path) -> None:
    data = measure(repo)
    data["commit"] = "0123456" * 5 + "01234"
    (repo / "benchmarks" / "results" / "fake.json").write_text(json.dumps(data))
    assert "⚠ **stale**: its commit 0123456 is unknown to this repository" in section(repo, "fake")


def test_uncommitted_changes_to_measured_paths_are_recorded_and_shown(repo: Path) -> None:
    (repo / "src" / "pkg" / "core.py").write_text("x = 3\n")
    (repo / "other" / "notes.txt").write_text("c\n")
    assert measure(repo)["dirty"] == ["src/pkg/core.py"]
    assert "⚠ measured with uncommitted changes in: src/pkg/core.py" in section(repo, "fake")


def test_a_measured_path_must_exist(repo: Path) -> None:
    with pytest.raises(ValueError, match="src/gone"):
        record.Result(repo / "benchmarks" / "fake.py", ["src/gone"], None, root=repo)


def test_a_benchmark_without_a_result_has_a_section_with_its_command(repo: Path) -> None:
    text = section(repo, "fake")
    assert "Fake benchmark: times the package." in text
    assert "No result recorded yet. To record one:\n\n    python benchmarks/fake.py --fast" in text


def test_check_fails_until_the_page_is_regenerated(repo: Path) -> None:
    assert results_page.main(["--root", str(repo), "--check"]) == 1  # no page yet
    assert results_page.main(["--root", str(repo)]) == 0
    assert results_page.main(["--root", str(repo), "--check"]) == 0
    measure(repo)
    assert results_page.main(["--root", str(repo), "--check"]) == 1  # a new result
    results_page.main(["--root", str(repo)])
    commit(repo, "src/pkg/core.py", "x = 4\n")
    assert results_page.main(["--root", str(repo), "--check"]) == 1  # the result went stale


def test_quoted_figures_are_refreshed_from_the_results(repo: Path) -> None:
    measure(repo, value=1041.0)
    quote = "Steps take <!-- result fake.step_s -->{}<!-- /result --> each.\n"
    (repo / "README.md").write_text(quote.format("old"))
    assert results_page.main(["--root", str(repo), "--check"]) == 1
    assert results_page.main(["--root", str(repo)]) == 0
    assert (repo / "README.md").read_text() == quote.format("17 min 21 s")
    assert results_page.main(["--root", str(repo), "--check"]) == 0
    (repo / "docs" / "page.md").write_text("<!-- result fake.nothing -->x<!-- /result -->")
    with pytest.raises(SystemExit, match=r"fake\.nothing"):
        results_page.main(["--root", str(repo)])


def test_the_committed_page_is_up_to_date() -> None:
    """Fails when a result was recorded, or what a result measures was committed, without running
    ``.venv/bin/python benchmarks/results_page.py`` (then commit docs/results.md)."""
    assert results_page.main(["--root", str(ROOT), "--check"]) == 0


def test_every_benchmark_records_its_result_and_has_a_section() -> None:
    page = (ROOT / "docs" / "results.md").read_text()
    scripts = [p for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in results_page.HELPERS]
    assert len(scripts) >= 25
    for script in scripts:
        source = script.read_text()
        assert "\nMEASURES = " in source, f"{script.name} declares no MEASURES"
        assert "record.start(" in source and "result.save()" in source, f"{script.name} records nothing"
        assert f"\n## {script.stem}\n" in page, f"docs/results.md has no section for {script.name}"
