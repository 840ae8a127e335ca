"""Merge concurrent sampling requests for the same prompt into one ``sample(num_samples=...)`` call.

A Tinker ``sample`` call takes one prompt and any number of samples, so the only requests that can
share a call are those with the same prompt tokens, sampling parameters and policy: exactly what a
GRPO group of agents sends on its first turn. Requests arriving within ``window_s`` of the first one
(or until ``max_samples`` samples are pending) share a call; the sequences are handed out in arrival
order. When no sample call is in flight a request is sent at once (waiting would only add latency
on an idle server); the window applies under load, which is when requests pile up. Requests with a
seed are never merged (their samples must be reproducible on their own).
Different prompts are submitted concurrently; the backend overlaps or batches them itself (the local
engine decodes concurrent calls in one batch: :mod:`tinkertrace.engine.continuous`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from dataclasses import dataclass, field
from typing import Any

from tinker import types


async def await_result(future: Any) -> Any:
    """Await what ``SamplingClient.sample`` returned: a Tinker APIFuture, an awaitable or a Future."""
    if hasattr(future, "result_async"):
        return await future.result_async()
    if isinstance(future, concurrent.futures.Future):
        return await asyncio.wrap_future(future)
    if inspect.isawaitable(future):
        return await future
    return await asyncio.to_thread(future.result)


@dataclass
class _Pending:
    client: Any
    prompt_ids: list[int]
    params: types.SamplingParams
    top_k: int
    waiters: list[tuple[int, asyncio.Future[list[Any]]]] = field(default_factory=list)
    total: int = 0
    handle: asyncio.TimerHandle | None = None


class SampleBatcher:
    """Coalesces identical concurrent requests; ``window_s=0`` submits every request on its own."""

    def __init__(self, window_s: float = 0.005, max_samples: int = 64) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self._pending: dict[tuple[Any, ...], _Pending] = {}
        self.calls = 0  # sample() calls made
        self.requests = 0  # requests served
        self._no_topk: set[type] = set()  # sampler classes that refused topk_sample_logprobs
        self._in_flight = 0  # sample() calls awaiting their result
        self._tasks: set[asyncio.Task[None]] = set()

    async def sample(
        self, client: Any, prompt_ids: list[int], n: int, params: types.SamplingParams, top_k: int = 0
    ) -> list[Any]:
        """``n`` sampled sequences for ``prompt_ids`` (Tinker ``SampledSequence`` objects)."""
        self.requests += 1
        if self.window_s <= 0 or params.seed is not None or n >= self.max_samples:
            return await self._call(client, prompt_ids, n, params, top_k)
        key = (id(client), tuple(prompt_ids), params.model_dump_json(), top_k)
        batch = self._pending.get(key)
        if batch is None and self._in_flight == 0:  # an idle server: waiting would only add latency
            return await self._call(client, prompt_ids, n, params, top_k)
        if batch is None:
            batch = self._pending[key] = _Pending(client, prompt_ids, params, top_k)
            batch.handle = asyncio.get_running_loop().call_later(self.window_s, self._flush, key, batch)
        waiter: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        batch.waiters.append((n, waiter))
        batch.total += n
        if batch.total >= self.max_samples:
            self._flush(key, batch)
        return await waiter

    def _flush(self, key: tuple[Any, ...], batch: _Pending) -> None:
        if self._pending.get(key) is not batch:
            return  # already flushed
        del self._pending[key]
        if batch.handle is not None:
            batch.handle.cancel()
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)  # keep a reference until it is done
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: _Pending) -> None:
        try:
            sequences = await self._call(
                batch.client, batch.prompt_ids, batch.total, batch.params, batch.top_k
            )
        except Exception as exc:
            for _, waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        start = 0
        for n, waiter in batch.waiters:
            if not waiter.done():
                waiter.set_result(sequences[start : start + n])
            start += n

    async def _call(
        self, client: Any, prompt_ids: list[int], n: int, params: types.SamplingParams, top_k: int
    ) -> list[Any]:
        self.calls += 1
        prompt = types.ModelInput.from_ints(prompt_ids)
        if top_k and type(client) not in self._no_topk:
            try:
                future = client.sample(
                    prompt=prompt, num_samples=n, sampling_params=params, topk_sample_logprobs=top_k
                )
            except ValueError:  # a backend without top-k logprobs (the local engine): sample without
                self._no_topk.add(type(client))
                future = client.sample(prompt=prompt, num_samples=n, sampling_params=params)
        else:
            future = client.sample(prompt=prompt, num_samples=n, sampling_params=params)
        self._in_flight += 1
        try:
            response = await await_result(future)
        finally:
            self._in_flight -= 1
        sequences = list(response.sequences)
        if len(sequences) != n:
            raise RuntimeError(f"the sampler returned {len(sequences)} sequences for num_samples={n}")
        return sequences
