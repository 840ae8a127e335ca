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
SRC = ROOT / "src"


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


def _imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """The tinkertrace modules ``module`` (at ``path``) imports, at its top or inside functions."""
    import ast

    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # its own package: no edge
                found.add(name)
    return found


def test_no_import_cycles_among_the_modules() -> None:
    """No module reaches itself through imports (lazy imports inside functions included): each layer
    depends only on the layers below it."""
    root = SRC / "tinkertrace"
    paths = {}
    for path in root.rglob("*.py"):
        parts = ("tinkertrace", *path.relative_to(root).with_suffix("").parts)
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {module: _imports_of(path, module, set(paths)) for module, path in paths.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                cycles.append([*trail[trail.index(imported) :], imported])
            elif imported not in state:
                visit(imported, [*trail, imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_readme_tables_name_files_that_exist() -> None:
    """Every path in backticks in the README's layout tables is there (relative to the repository or to
    src/tinkertrace)."""
    import re

    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    named = set(re.findall(r"`([\w./-]+\.(?:py|md|json|yaml)|[\w-]+/(?:[\w-]+/)*)`", layout))
    missing = [p for p in sorted(named) if not (ROOT / p).exists() and not (SRC / "tinkertrace" / p).exists()]
    assert named and not missing, missing
