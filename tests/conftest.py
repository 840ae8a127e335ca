"""Shared fixtures: a deterministic OpenAI-compatible server on a loopback port; compiled kernels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tinkertrace.testing.openai_server import RunningServer, ServerOptions, start_server


def _expected_length(item: pytest.Item) -> int:
    """A test's own timeout when it declares one (the longest end-to-end runs), 1 when marked slow, else 0."""
    timeout = item.get_closest_marker("timeout")
    return int(timeout.args[0]) if timeout else int(item.get_closest_marker("slow") is not None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with the longest tests first (order within a file kept): `make test` hands each worker a
    whole file, so the long ones start early instead of keeping one worker busy after the other is done."""
    longest: dict[Path, int] = {}
    for item in items:
        longest[item.path] = max(longest.get(item.path, 0), _expected_length(item))
    items.sort(key=lambda item: -longest[item.path])


@pytest.fixture(scope="session", autouse=True)
def _compiled_span_scan() -> None:
    """Compile (or load from numba's cache) the span converter's kernels once, before any test, so no
    test's embedded sink or collector pays the first compilation inside its own timeouts."""
    from tinkertrace.spanstore.convert import warm_up_kernels

    warm_up_kernels()


@pytest.fixture(scope="session")
def _openai_server_session() -> Iterator[RunningServer]:
    running = start_server()
    yield running
    running.stop()


@pytest.fixture
def openai_server(_openai_server_session: RunningServer) -> Iterator[RunningServer]:
    """A running test server (shared per session) with fresh default options and an empty request log.

    Use ``openai_server.base_url`` as the OpenAI client's ``base_url``; change behaviour through
    ``openai_server.options`` (responder, token_ids, logprobs, latency_s, fail_status, ...).
    """
    running = _openai_server_session
    running.server.options = ServerOptions()
    running.requests.clear()
    yield running
    running.server.options = ServerOptions()
