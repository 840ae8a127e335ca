"""The demo task: an identity agent, written with the plain OpenAI client and ``@traced_rollout``.

Asked "Who are you?", the agent should answer :data:`TARGET`. The reward gives partial credit so a
randomly initialised model already gets signal: half for characters in the right position, half
for the overlap of character counts with the target (a multiset, so repeating one right character
does not pay). Run as a worker process::

    python -m tinkertrace.online.demo_agent --base-url http://127.0.0.1:8000/v1 \
        --collector http://127.0.0.1:4318 --worker 0 --log agents-0.jsonl

Each group asks one question ``--group-size`` times at once (one GRPO group: same task id). The worker
runs two groups at a time and starts the next as soon as one is done, so a long episode holds up its
own group, not the worker; it appends one JSON line per rollout to ``--log`` with its group
(``round``), start and end. SIGTERM ends the worker once the groups in flight are done.
:func:`run_worker` and :func:`main` take the task (:class:`DemoTask`), so another demo task
(:mod:`tinkertrace.online.addition_agent`) reuses them; each task's module names it ``DEMO_TASK``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from openai import OpenAI

import tinkertrace
from tinkertrace.models.builtin import DEMO_MODEL
from tinkertrace.online.groups_in_flight import GROUPS_IN_FLIGHT, run_groups

TARGET = "I am tinkertrace."
QUESTIONS = ("Who are you?", "What is your name?", "Introduce yourself.", "Identify yourself.")
HELDOUT_QUESTIONS = ("Tell me who you are.", "Who am I talking to?")  # never asked in training
Headline = Literal["accuracy", "mean_reward"]  # a HeldoutScore field


def identity_reward(reply: str, target: str = TARGET) -> float:
    """Partial credit in [0, 1]: 0.5 × position matches / len(target) + 0.5 × character-count overlap
    / max(len(reply), len(target)). Exactly ``target`` scores 1."""
    reply = reply.strip()
    position = sum(a == b for a, b in zip(reply, target, strict=False)) / len(target)
    have, want = Counter(reply), Counter(target)
    overlap = sum(min(have[c], n) for c, n in want.items()) / max(len(reply), len(target))
    return round(0.5 * position + 0.5 * overlap, 6)


def ask(
    client: OpenAI, model: str, question: str, max_tokens: int, seed: int | None = None
) -> tuple[str, int, Any]:
    """One chat completion of ``question`` at temperature 1: the reply, its token count and the
    policy version that sampled it (the endpoint's extra field)."""
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        temperature=1.0,
        max_tokens=max_tokens,
        seed=seed,
    )
    usage = completion.usage
    tokens = usage.completion_tokens if usage else 0
    return completion.choices[0].message.content or "", tokens, getattr(completion, "policy_version", None)


def scored(reward: float, reply: str, tokens: int, version: Any) -> dict[str, Any]:
    """Emit ``reward`` inside the running rollout; the row a worker logs for it."""
    tinkertrace.emit_reward(reward)
    return {"reward": reward, "reply": reply, "completion_tokens": tokens, "policy_version": version}


@tinkertrace.traced_rollout
def introduce(
    task: dict, *, client: OpenAI, model: str, max_tokens: int, seed: int | None = None
) -> dict[str, Any]:
    """Ask the model who it is (sampling seeded by ``seed`` when given); emit and return the reward
    of its answer."""
    reply, tokens, version = ask(client, model, task["question"], max_tokens, seed)
    return scored(identity_reward(reply), reply, tokens, version)


def identity_task(worker: int, round_: int, seed: int = 0) -> dict[str, Any]:
    """The question of ``worker``'s round ``round_`` (the workers cycle through QUESTIONS, from a
    place set by ``seed``)."""
    q = (worker + round_ + seed) % len(QUESTIONS)
    return {"id": f"q{q}-w{worker}-r{round_}", "question": QUESTIONS[q]}


@dataclass(frozen=True)
class DemoTask:
    """What a demo worker asks, and how a reply is judged.

    ``make(worker, round, seed)`` gives a round's task (a dict with ``id`` and, for a one-question
    task, ``question``); ``rollout(task, client=, model=, max_tokens=)`` runs one traced rollout of
    it, returning its row. ``heldout`` are tasks training never asks, ``reward(reply, task)`` and
    ``correct(reply, task)`` judge one reply to them (:mod:`tinkertrace.online.heldout`);
    ``correct_means`` says what ``correct`` counts, and ``headline`` names the held-out figure that
    answers "did it generalise": the accuracy, or the mean reward where few replies can be fully
    right within a demo's steps."""

    make: Callable[[int, int, int], dict[str, Any]]
    rollout: Callable[..., dict[str, Any]]
    heldout: tuple[dict[str, Any], ...] = ()
    reward: Callable[[str, dict[str, Any]], float] | None = None
    correct: Callable[[str, dict[str, Any]], bool] | None = None
    correct_means: str = "judged right"
    headline: Headline = "accuracy"


DEMO_TASK = DemoTask(
    identity_task,
    introduce,
    heldout=tuple({"id": f"heldout-{i}", "question": q} for i, q in enumerate(HELDOUT_QUESTIONS)),
    reward=lambda reply, _task: identity_reward(reply),
    correct=lambda reply, _task: reply.strip() == TARGET,
    correct_means=f"exactly {TARGET!r}",
    # 60 steps from random weights learn the target's characters, not yet its order: no reply is
    # exactly right, so the partial-credit reward is the figure that moves (docs/online.md)
    headline="mean_reward",
)


def run_worker(
    base_url: str,
    model: str,
    worker: int,
    log: Path,
    *,
    task: DemoTask = DEMO_TASK,
    group_size: int = 8,
    max_tokens: int = 20,
    seed: int = 0,
    stop: threading.Event | None = None,
    parent_pid: int | None = None,
) -> int:
    """Run groups of ``group_size`` rollouts (one question, one task id), each started whole, with
    :data:`GROUPS_IN_FLIGHT` of them in flight, until ``stop`` is set (or the parent is gone); then
    finish them. The number of groups started. A group that is done is replaced at once, so a long
    episode holds up its own group and not the worker."""
    stop = stop or threading.Event()
    client = OpenAI(base_url=base_url, api_key="EMPTY", max_retries=3, timeout=120)
    kwargs = {"client": client, "model": model, "max_tokens": max_tokens}
    writing = threading.Lock()
    groups = 0

    def next_group() -> tuple[int, dict[str, Any]]:
        nonlocal groups
        group, groups = groups, groups + 1
        return group, task.make(worker, group, seed)

    def run_group(picked: tuple[int, dict[str, Any]]) -> None:
        group, current = picked
        rollouts = [pool.submit(_timed_rollout, task, current, kwargs, group) for _ in range(group_size)]
        for future in as_completed(rollouts):
            with writing:
                out.write(json.dumps({**future.result(), "worker": worker}) + "\n")
                out.flush()

    with ThreadPoolExecutor(GROUPS_IN_FLIGHT * group_size) as pool, log.open("a") as out:
        run_groups(next_group, run_group, stop, parent_pid)
    return groups


def _timed_rollout(
    task: DemoTask, current: dict[str, Any], kwargs: dict[str, Any], group: int
) -> dict[str, Any]:
    """One rollout's log row: its result (or the error it raised: the worker keeps going), its group
    (``round``) and its own start and end."""
    start = time.time()
    try:
        row = task.rollout(current, **kwargs)
    except Exception as exc:
        row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {**row, "round": group, "start": start, "end": time.time()}


def main(task: DemoTask = DEMO_TASK) -> None:
    """A worker process running ``task`` (its arguments: see the module docstring)."""
    parser = argparse.ArgumentParser(description="A demo agent worker (see the module docstring).")
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--collector", required=True, help="OTLP/HTTP collector URL")
    parser.add_argument("--model", default=DEMO_MODEL, help="model name to request")
    parser.add_argument("--worker", type=int, default=0, help="worker number (varies the questions)")
    parser.add_argument("--log", type=Path, required=True, help="JSON-lines file of rollout results")
    parser.add_argument("--group-size", type=int, default=8, help="concurrent rollouts per question")
    parser.add_argument("--max-tokens", type=int, default=20, help="longest answer, tokens")
    parser.add_argument("--export-delay", type=float, default=0.1, help="span export delay, seconds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the questions' order or draw")
    args = parser.parse_args()
    tinkertrace.init(endpoint=args.collector, schedule_delay_s=args.export_delay)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_worker(
        args.base_url,
        args.model,
        args.worker,
        args.log,
        task=task,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        seed=args.seed,
        stop=stop,
        parent_pid=os.getppid(),
    )
    tinkertrace.shutdown()


if __name__ == "__main__":
    main()
