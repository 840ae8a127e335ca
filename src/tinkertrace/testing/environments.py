"""The environments `make test` builds for foreign packages (.venv-agents, .venv-cookbook, Node, ...)."""

from __future__ import annotations

import os

FAST_LANE_ENV = "TINKERTRACE_FAST_LANE"
"""Set by `make check`: the fast lane runs in .venv alone, so modules needing a foreign environment skip."""


def require_built(present: bool, what: str, make_target: str) -> None:
    """Call at a test module's top: when ``what`` is missing, fail on CI (`make test` builds it, so its
    absence is a broken set-up) and skip the module elsewhere, naming the make target that builds it.
    In the fast lane (:data:`FAST_LANE_ENV` set) the module skips whether or not ``what`` is there."""
    import pytest

    if os.environ.get(FAST_LANE_ENV):
        pytest.skip(f"{what}: not in the fast lane (`make test` runs it)", allow_module_level=True)
    if present:
        return
    if os.environ.get("CI"):
        raise RuntimeError(f"{what} is missing: `make {make_target}` should have built it")

    pytest.skip(f"{what} is missing: run `make {make_target}`", allow_module_level=True)
