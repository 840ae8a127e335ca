"""What ``tinkertrace engine`` keeps between requests: sessions, training models, samplers, futures.

Tinker's protocol is asynchronous: a training or sampling call answers at once with a request id
(an ``UntypedAPIFuture``), and the client polls ``/api/v1/retrieve_future`` for the result. The
calls of one training model carry a ``seq_id`` and must run in that order, even when the SDK sends
them concurrently (it sends the chunks of one ``forward_backward`` in parallel, the first last).
:class:`ModelSequencer` holds calls back until every earlier ``seq_id`` has been handed to the
engine, whose per-client worker then runs them in that order.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from tinkertrace.engine.sampling import SamplingClient
from tinkertrace.engine.training import TrainingClient
from tinkertrace.futures import settle_from

Encoding = Literal["json", "proto"]
RESULT_TTL_S = 3600.0
"""A finished result nobody retrieved for this long is dropped (its client is gone)."""
PendingCall = Callable[[], Future[Any]]


class UnknownResourceError(LookupError):
    """A session, model, sampler or request id the server does not know (HTTP 404)."""


class SessionFinishedError(ValueError):
    """A model or sampler made for a session that has finished meanwhile (closed, or expired without
    heartbeats while the model was being built): it would never be released."""


@dataclass
class PendingResult:
    """The result of one asynchronous request, and how its retrieval must encode it."""

    future: Future[Any]
    encoding: Encoding
    created: float = field(default_factory=time.monotonic)


class ModelSequencer:
    """Starts a model's calls strictly in ``seq_id`` order, whatever order they arrive in.

    ``submit(seq_id, call)`` returns a future at once. ``call`` (which hands the work to the
    engine's ordered worker and returns the engine's future) runs only once every smaller
    ``seq_id`` has been started. Thread-safe.
    """

    def __init__(self, next_seq_id: int = 1) -> None:
        self._next = next_seq_id
        self._waiting: dict[int, tuple[PendingCall, Future[Any]]] = {}
        self._lock = threading.Lock()

    def submit(self, seq_id: int, call: PendingCall) -> Future[Any]:
        outer: Future[Any] = Future()
        with self._lock:
            if seq_id < self._next or seq_id in self._waiting:
                raise ValueError(f"seq_id {seq_id} was already used for this model (next is {self._next})")
            self._waiting[seq_id] = (call, outer)
            ready = []
            while self._next in self._waiting:
                ready.append(self._waiting.pop(self._next))
                self._next += 1
            # Started under the lock: the engine's worker queue then receives them in seq order.
            for start, result in ready:
                _chain(start, result)
        return outer


def _chain(start: PendingCall, result: Future[Any]) -> None:
    """Run ``start()`` and settle ``result`` from the future it returns."""
    try:
        inner = start()
    except Exception as exc:  # refused before it was queued (bad loss name, bad params, ...)
        result.set_exception(exc)
        return
    settle_from(result, inner)


@dataclass
class TrainingModel:
    """A training client of the engine under its Tinker model id."""

    model_id: str
    session_id: str
    client: TrainingClient
    sequencer: ModelSequencer
    created: float = field(default_factory=time.time)
    last_request: float = field(default_factory=time.time)


@dataclass
class Sampler:
    """A sampling session: an engine SamplingClient and where its weights came from."""

    sampler_id: str
    base_model: str
    model_path: str | None
    client: SamplingClient
    clones: int = 0
    """Client ids handed out by ``join_sampling_session``."""


class ServerState:
    """All sessions, models, samplers and pending results of one ``tinkertrace engine`` process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sessions: dict[str, dict[str, Any]] = {}
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, Sampler] = {}
        self._results: dict[str, PendingResult] = {}
        self._request_counter = itertools.count(1)

    # -- sessions ----------------------------------------------------------------------------

    def new_session(self, info: dict[str, Any]) -> str:
        session_id = str(uuid.uuid4())
        with self._lock:
            self.sessions[session_id] = {**info, "created": time.time(), "heartbeat": time.time()}
        return session_id

    def finish_session(self, session_id: str) -> list[TrainingClient | SamplingClient]:
        """Mark a session finished and forget its models and samplers; returns their engine clients,
        for the caller to close (checkpoints stay on disk)."""
        self.session(session_id).setdefault("finished", time.time())
        with self._lock:
            models = [m for m in self.models.values() if m.session_id == session_id]
            samplers = [s for s in self.samplers.values() if s.sampler_id.startswith(f"{session_id}:")]
            for model in models:
                del self.models[model.model_id]
            for sampler in samplers:
                del self.samplers[sampler.sampler_id]
        return [m.client for m in models] + [s.client for s in samplers]

    def session(self, session_id: str) -> dict[str, Any]:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise UnknownResourceError(f"unknown session_id {session_id!r}") from None

    # -- models and samplers -----------------------------------------------------------------

    def add_model(self, model: TrainingModel) -> None:
        with self._lock:
            self._check_open(model.session_id)
            self.models[model.model_id] = model

    def _check_open(self, session_id: str) -> None:
        if self.session(session_id).get("finished"):
            raise SessionFinishedError(f"session {session_id} has finished: start a new session")

    def model(self, model_id: str) -> TrainingModel:
        try:
            model = self.models[model_id]
        except KeyError:
            raise UnknownResourceError(
                f"unknown model_id {model_id!r}: create it with create_lora_training_client first"
            ) from None
        model.last_request = time.time()
        return model

    def add_sampler(self, sampler: Sampler) -> None:
        with self._lock:
            self._check_open(sampler.sampler_id.split(":", 1)[0])
            self.samplers[sampler.sampler_id] = sampler

    def sampler(self, sampler_id: str) -> Sampler:
        try:
            return self.samplers[sampler_id]
        except KeyError:
            raise UnknownResourceError(f"unknown sampling_session_id {sampler_id!r}") from None

    # -- asynchronous results ----------------------------------------------------------------

    def track(self, future: Future[Any], encoding: Encoding = "json") -> str:
        """Register a pending result; its request id for ``retrieve_future``."""
        request_id = f"req-{next(self._request_counter)}-{uuid.uuid4().hex[:8]}"
        now = time.monotonic()
        with self._lock:
            stale = [
                k for k, r in self._results.items() if r.future.done() and now - r.created > RESULT_TTL_S
            ]
            for key in stale:
                del self._results[key]
            self._results[request_id] = PendingResult(future, encoding)
        return request_id

    def result(self, request_id: str) -> PendingResult:
        try:
            return self._results[request_id]
        except KeyError:
            raise UnknownResourceError(
                f"unknown request_id {request_id!r} (never issued, or its result was already retrieved)"
            ) from None

    def forget(self, request_id: str) -> None:
        """Drop a delivered result (results are kept until retrieved once)."""
        with self._lock:
            self._results.pop(request_id, None)

    def cancel(self, request_id: str) -> None:
        """Cancel a result nobody will retrieve (a no-op once its work has started)."""
        with self._lock:
            pending = self._results.pop(request_id, None)
        if pending is not None:
            pending.future.cancel()
