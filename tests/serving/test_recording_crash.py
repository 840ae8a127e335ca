"""An answered call is a stored call, through kill -9.

Three agents (the real OpenAI client, in threads) run rollouts against a real recording process
(`tinkertrace serve` on the built-in model, or `tinkertrace proxy` in front of a plain `serve`), each
rollout two calls (one streamed) through the URL prefix, a reward and a finish. The recording process
is killed with SIGKILL twice under that load and restarted on the same folder; agents retry what got
no answer. Afterwards every call answered 200 is stored exactly once, every reward answered 200 is
stored, every finished rollout has one rollout span whose counts match its stored spans, rollouts
opened before a kill are rewarded and finished after it, and the builder builds every finished one.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import httpx
import openai
import pytest

from tinkertrace import semconv
from tinkertrace.builder.build import build_trajectories
from tinkertrace.collector.launch import running_collector
from tinkertrace.models.tokenizer import BUILTIN_MODEL
from tinkertrace.netutil import free_port
from tinkertrace.spanstore.reader import open_spans

AGENTS, KILLS, LOAD_S = 3, 2, 3.0
CLI = [sys.executable, "-m", "tinkertrace.cli.main"]
RETRIED = (openai.APIConnectionError, openai.InternalServerError, httpx.HTTPError)
T = TypeVar("T")


@dataclass
class Ledger:
    """What the agents were answered (shared by the agent threads)."""

    epoch: int = 0  # kills so far
    answered: dict[str, str] = field(default_factory=dict)  # response id -> rollout id
    rewards_ok: Counter[str] = field(default_factory=Counter)
    rewards_unanswered: Counter[str] = field(default_factory=Counter)
    finished: set[str] = field(default_factory=set)
    across_kill: set[str] = field(default_factory=set)  # opened before a kill, finished after it
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _wait_healthy(port: int, proc: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the process on port {port} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"nothing healthy on port {port} after {timeout}s")


@contextmanager
def _process(cmd: list[str], port: int, log: Path) -> Iterator[subprocess.Popen[Any]]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(port, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


def _retrying(step: Callable[[], T], stop_at: float) -> T:
    """``step()`` until it gets an answer (the recording process may be down, restarting)."""
    while True:
        try:
            return step()
        except RETRIED:
            if time.monotonic() > stop_at:
                raise
            time.sleep(0.2)


def _call(client: openai.OpenAI, streamed: bool) -> str:
    """One chat call; its response id once wholly answered (a stream read to its end)."""
    turn = [{"role": "user", "content": "hi"}]
    if not streamed:
        return client.chat.completions.create(model=BUILTIN_MODEL, messages=turn, max_tokens=6).id
    chunks = client.chat.completions.create(model=BUILTIN_MODEL, messages=turn, max_tokens=6, stream=True)
    return [chunk.id for chunk in chunks][-1]


def _post(url: str, tries: list[str]) -> httpx.Response:
    tries.append(url)
    return httpx.post(url, json={}, timeout=60)


def _agent(n: int, base: str, ledger: Ledger, stop: threading.Event) -> None:
    """Rollouts of two calls, a reward and a finish, until ``stop``; answers noted in ``ledger``."""
    stop_at = time.monotonic() + 600
    rollout_no = 0
    while not stop.is_set():
        rollout = f"agent{n}-{rollout_no}"
        rollout_no += 1
        client = openai.OpenAI(
            base_url=f"{base}/rollouts/{rollout}/v1", api_key="k", max_retries=0, timeout=60
        )
        opened = None
        for streamed in (False, True):
            response_id = _retrying(functools.partial(_call, client, streamed), stop_at)
            with ledger.lock:
                ledger.answered[response_id] = rollout
                opened = ledger.epoch if opened is None else opened
        try:
            reward = httpx.post(f"{base}/v1/rollouts/{rollout}/reward", json={"value": 1.0}, timeout=60)
            with ledger.lock:
                if reward.status_code == 200:
                    ledger.rewards_ok[rollout] += 1
                else:
                    ledger.failures.append(f"reward {rollout}: {reward.status_code} {reward.text}")
        except httpx.HTTPError:  # no answer: maybe stored, maybe not; not sent again
            with ledger.lock:
                ledger.rewards_unanswered[rollout] += 1
        tries: list[str] = []
        finish = _retrying(functools.partial(_post, f"{base}/v1/rollouts/{rollout}/finish", tries), stop_at)
        retried = finish.status_code == 409 and len(tries) > 1
        with ledger.lock:
            if finish.status_code == 200 or retried:  # 409: an earlier try without an answer was stored
                ledger.finished.add(rollout)
                if ledger.epoch != opened:
                    ledger.across_kill.add(rollout)
            else:
                ledger.failures.append(f"finish {rollout}: {finish.status_code} {finish.text}")


def _query(spans: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    open_spans(con, spans)
    return con.execute(sql).fetchall()


def _attr(name: str) -> str:
    return f"json_extract_string(attributes, '$.\"{name}\"')"


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("front,target", [("serve", "spans_dir"), ("proxy", "collector")])
def test_every_answered_call_reward_and_finish_is_stored_through_kill_9(
    front: str, target: str, tmp_path: Path
) -> None:
    spans, log = tmp_path / "spans", tmp_path / "processes.log"
    port = free_port()
    with ExitStack() as stack:
        if target == "collector":
            collector_port = free_port()
            log_file = stack.enter_context(open(log, "ab"))
            options = ("--no-grpc", "--roll-seconds", "0.2")
            running = running_collector(spans, collector_port, *options, output=log_file)
            collector = stack.enter_context(running)
            recording = ["--collector", collector, "--spool-dir", str(tmp_path / "spool")]
        else:
            recording = ["--spans-dir", str(spans)]
        if front == "proxy":
            upstream_port = free_port()
            serve = [*CLI, "serve", "--port", str(upstream_port), "--engine-dir", str(tmp_path / "engine")]
            stack.enter_context(_process(serve, upstream_port, log))
            cmd = [*CLI, "proxy", "--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--port", str(port)]
        else:
            cmd = [*CLI, "serve", "--port", str(port), "--engine-dir", str(tmp_path / "engine")]
        cmd += recording
        ledger, stop = Ledger(), threading.Event()
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _wait_healthy(port, proc)
        agents = [
            threading.Thread(target=_agent, args=(n, f"http://127.0.0.1:{port}", ledger, stop))
            for n in range(AGENTS)
        ]
        for agent in agents:
            agent.start()
        try:
            for _ in range(KILLS):
                answered = len(ledger.answered)
                deadline = time.monotonic() + 60
                time.sleep(LOAD_S)
                while len(ledger.answered) < answered + 2 * AGENTS and time.monotonic() < deadline:
                    time.sleep(0.1)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                with ledger.lock:
                    ledger.epoch += 1
                with open(log, "ab") as out:
                    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
                _wait_healthy(port, proc)
            time.sleep(LOAD_S)
        finally:
            stop.set()
            for agent in agents:
                agent.join(300)
            proc.terminate()
            proc.wait(60)
        if target == "collector":  # the collector writes what it took within its roll time
            _wait_for(lambda: _all_arrived(spans, ledger), 60)

    llm = dict(
        _query(
            spans, "SELECT response_id, count(DISTINCT span_id) FROM spans WHERE span_type = 'llm' GROUP BY 1"
        )
    )
    missing = [r for r in ledger.answered if r not in llm]
    assert not missing, f"{len(missing)} of {len(ledger.answered)} answered calls are not stored"
    assert all(llm[r] == 1 for r in ledger.answered)
    assert not ledger.failures, ledger.failures[:5]
    assert len(ledger.finished) >= AGENTS and ledger.across_kill, (ledger.finished, ledger.across_kill)
    rollout_ids = ", ".join(f"'{r}'" for r in ledger.finished)
    if target == "spans_dir":  # Parquet written from the journal holds each span once
        [(rows, distinct)] = _query(spans, "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans")
        assert rows == distinct
    rewards = dict(
        _query(
            spans,
            "SELECT rollout_id, count(DISTINCT span_id) FROM spans WHERE span_type = 'reward' GROUP BY 1",
        )
    )
    for rollout, ok in ledger.rewards_ok.items():
        assert ok <= rewards.get(rollout, 0) <= ok + ledger.rewards_unanswered[rollout], rollout
    roots = _query(
        spans,
        f"""SELECT r.rollout_id, count(DISTINCT r.span_id), min({_attr(semconv.ROLLOUT_STATUS)}),
                   min(TRY_CAST({_attr(semconv.ROLLOUT_LLM_CALLS)} AS INT)),
                   (SELECT count(DISTINCT span_id) FROM spans l
                    WHERE l.span_type = 'llm' AND l.rollout_id = r.rollout_id)
            FROM spans r WHERE r.span_type = 'rollout' AND r.rollout_id IN ({rollout_ids}) GROUP BY 1""",
    )
    assert len(roots) == len(ledger.finished)
    for rollout, root_spans, status, llm_calls, llm_spans in roots:
        assert (root_spans, status) == (1, "succeeded"), rollout
        assert llm_calls == llm_spans >= 2, rollout
    built = set(build_trajectories(spans).summary.rollout_ids)
    assert ledger.finished <= built


def _all_arrived(spans: Path, ledger: Ledger) -> bool:
    """Whether every answered call and every finished rollout's span is in the Parquet files yet."""
    if not any(spans.rglob("*.parquet")):
        return False
    sql = "SELECT DISTINCT coalesce(response_id, rollout_id) FROM spans WHERE span_type IN ('llm', 'rollout')"
    stored = {r[0] for r in _query(spans, sql)}
    return stored >= set(ledger.answered) | ledger.finished


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
