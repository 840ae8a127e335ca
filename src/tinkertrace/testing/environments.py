"""The environments `make test` builds for foreign packages (.venv-agents, .venv-cookbook, Node, ...)."""

from __future__ import annotations

import os


def require_built(present: bool, what: str, make_target: str) -> None:
    """Call at a test module's top: when ``what`` is missing, fail on CI (`make test` builds it, so its
    absence is a broken set-up) and skip the module elsewhere, naming the make target that builds it."""
    if present:
        return
    if os.environ.get("CI"):
        raise RuntimeError(f"{what} is missing: `make {make_target}` should have built it")
    import pytest

    pytest.skip(f"{what} is missing: run `make {make_target}`", allow_module_level=True)
