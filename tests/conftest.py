"""Shared fixtures: a deterministic OpenAI-compatible server on a loopback port; compiled kernels."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tinkertrace.testing.openai_server import RunningServer, ServerOptions, start_server


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
