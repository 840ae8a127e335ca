"""Fixtures for the sampling endpoint tests.

``ScriptedTinkerSampler`` (:mod:`tinkertrace.testing.scripted_sampler`) stands in for the *hosted*
Tinker SamplingClient (unreachable here), replying with scripted texts so stop-string and length
handling can be checked exactly. Everything
else (the local engine, the server, the OpenAI client, sockets) is real.
``RecordingSampler`` wraps any SamplingClient and keeps every SampleResponse it returned, so tests
can compare the server's answers with what the backend really sampled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import openai
import pytest
from tinker import types

from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler


class RecordingSampler:
    """Delegates ``sample`` to ``inner`` and records ``(prompt ids, SampleResponse)`` pairs."""

    def __init__(self, inner: Any, tag: Any = None) -> None:
        self.inner = inner
        self.tag = tag
        self.responses: list[tuple[list[int], types.SampleResponse]] = []
        self._lock = threading.Lock()

    def sample(
        self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams, **kw: Any
    ) -> Any:
        future = self.inner.sample(
            prompt=prompt, num_samples=num_samples, sampling_params=sampling_params, **kw
        )
        concurrent_future = future.future() if hasattr(future, "future") else future
        ids = prompt.to_ints()

        def record(done: Future) -> None:
            if done.exception() is None:
                with self._lock:
                    self.responses.append((ids, done.result()))

        concurrent_future.add_done_callback(record)
        return future

    def sequences(self) -> list[list[int]]:
        with self._lock:
            return [list(seq.tokens) for _, resp in self.responses for seq in resp.sequences]


def client_for(server: BackgroundServer, api_key: str = "unused") -> openai.OpenAI:
    """The real OpenAI client pointed at ``server`` (no retries, so failures show)."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)


@pytest.fixture
def tokenizer() -> Any:
    return load_tokenizer(BUILTIN_MODEL)


@pytest.fixture
def start_server() -> Iterator[Callable[..., BackgroundServer]]:
    """Factory: ``start_server(policy, **create_app_options)`` on a free port, stopped at teardown."""
    servers: list[BackgroundServer] = []

    def start(policy: PolicyHolder, **options: Any) -> BackgroundServer:
        app = create_app(policy, **options)
        server = BackgroundServer(app).start()
        server.app = app  # for tests that look at the endpoint's state
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def scripted() -> type[ScriptedTinkerSampler]:
    return ScriptedTinkerSampler


@pytest.fixture
def recording() -> type[RecordingSampler]:
    return RecordingSampler


@pytest.fixture
def openai_client() -> Callable[..., openai.OpenAI]:
    return client_for


@pytest.fixture
def scripted_server(
    tokenizer: Any, start_server: Callable[..., BackgroundServer]
) -> tuple[BackgroundServer, ScriptedTinkerSampler, PolicyHolder]:
    sampler = ScriptedTinkerSampler(["hello world. more text", "second reply"])
    policy = PolicyHolder(sampler, tokenizer, "scripted-model")
    return start_server(policy), sampler, policy


class Recording:
    """A recording endpoint under test: ``serve`` itself, or a ``proxy`` in front of a plain ``serve``;
    ``url`` is where agents call, ``spans`` the folder its recorder writes."""

    def __init__(self, kind: str, url: str, recorder: Any, spans: Any) -> None:
        self.kind, self.url, self.recorder, self.spans = kind, url, recorder, spans

    def query(self, sql: str) -> list[tuple]:
        """``sql`` over the spans recorded so far (flushed first)."""
        import duckdb

        from tinkertrace.spanstore.reader import open_spans

        assert self.recorder.flush(30)
        con = duckdb.connect()
        open_spans(con, self.spans)
        return con.execute(sql).fetchall()


@pytest.fixture
def recording_endpoint(
    tokenizer: Any, start_server: Callable[..., BackgroundServer], tmp_path: Any
) -> Iterator[Callable[..., Recording]]:
    """``recording_endpoint("serve" | "proxy", replies=[...], **app_options)``: a recording endpoint on
    a free port (options go to the app that records: ``create_app`` or ``create_proxy_app``)."""
    from tinkertrace.serving.proxy import create_proxy_app
    from tinkertrace.serving.recording import CallRecorder

    def start(kind: str, replies: list[str] | None = None, **options: Any) -> Recording:
        spans = tmp_path / f"spans-{kind}-{len(list(tmp_path.iterdir()))}"
        recorder = CallRecorder(spans_dir=spans, schedule_delay_s=0.05)
        policy = PolicyHolder(ScriptedTinkerSampler(replies or ["a reply"]), tokenizer, "scripted-model")
        if kind == "serve":
            return Recording(kind, start_server(policy, recorder=recorder, **options).url, recorder, spans)
        upstream = start_server(policy)
        proxy = BackgroundServer(create_proxy_app(upstream.url + "/v1", recorder=recorder, **options)).start()
        request_stop.append(proxy)
        return Recording(kind, proxy.url, recorder, spans)

    request_stop: list[BackgroundServer] = []
    yield start
    for server in request_stop:
        server.stop()
