"""Where the sampler runs while the trainer steps: the trainer's step time and the sampler's tokens/s
with decoding in a thread of the trainer's process (the demo's stack), or in a process of its own (as
``tinkertrace serve`` beside ``train --follow --publish-url``).

One local-engine ``ServiceClient`` trains long-tail batches (32 rollouts of 1-10 turns × 75 tokens, as
``benchmarks/length_grouping.py``, 4 minibatches a step); a load of 16 concurrent 20-token samples at a
time decodes on the same base model. Each round times two steps in each arrangement, in a shuffled
order: ``alone`` (no sampling; the sampler's own rate is measured after, with no training), ``thread``
(the load in this process) and ``process`` (the load in a spawned process with ``--sampler-threads``
torch threads). Prints each round and the medians.

    .venv/bin/python benchmarks/sampler_placement.py --rounds 4
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import record
from length_grouping import datum
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.models.builtin import DEMO_MODEL

MEASURES = ("src/tinkertrace/engine", "src/tinkertrace/models")

PROMPT = types.ModelInput.from_ints(list(range(30, 180)))
PARAMS = types.SamplingParams(max_tokens=20, temperature=1.0)
CONCURRENT = 16
TURNS = [1] * 14 + [2] * 6 + [3] * 4 + [4, 4, 5, 6, 7, 8, 9, 10]  # 32 rollouts, a long tail


def decode_load(client: Any, stop: threading.Event | Any, tokens: list[int]) -> None:
    """Keep ``CONCURRENT`` samples in flight until ``stop``; count sampled tokens in ``tokens[0]``."""
    while not stop.is_set():
        futures = [client.sample(PROMPT, 1, PARAMS) for _ in range(CONCURRENT)]
        for future in futures:
            tokens[0] += len(future.result().sequences[0].tokens)


def sampler_process(stop: Any, counted: Any, ready: Any, threads: int) -> None:
    """The load in a process of its own: its own engine, ``threads`` torch threads."""
    import torch

    torch.set_num_threads(threads)
    client = ServiceClient().create_sampling_client(base_model=DEMO_MODEL)
    client.sample(PROMPT, 1, PARAMS).result()
    ready.set()
    tokens = [0]
    worker = threading.Thread(target=decode_load, args=(client, stop, tokens))
    worker.start()
    while not stop.is_set():
        time.sleep(0.05)
        counted.value = tokens[0]
    worker.join()


Load = tuple[Callable[[], int], Callable[[], None]]  # its sampled tokens so far; stop it


def thread_load(sampler: Any) -> Load:
    """The load on ``sampler`` in a thread of this process."""
    stop, tokens = threading.Event(), [0]
    worker = threading.Thread(target=decode_load, args=(sampler, stop, tokens))
    worker.start()

    def end() -> None:
        stop.set()
        worker.join()

    return lambda: tokens[0], end


def process_load(context: Any, threads: int) -> Load:
    """The load in a spawned process with ``threads`` torch threads (returns once it decodes)."""
    stop, counted, ready = context.Event(), context.Value("l", 0), context.Event()
    child = context.Process(target=sampler_process, args=(stop, counted, ready, threads))
    child.start()
    ready.wait(120)

    def end() -> None:
        stop.set()
        child.join()

    return lambda: int(counted.value), end


def idle(seconds: float = 2.0) -> float:
    """Sleep ``seconds`` (the sampler alone, nothing else running); returns them."""
    time.sleep(seconds)
    return seconds


def under_load(count: Callable[[], int], run: Callable[[], float]) -> tuple[float, float]:
    """``run()``'s result, and the tokens per second the load sampled meanwhile."""
    before, started = count(), time.perf_counter()
    result = run()
    return result, (count() - before) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sampler-threads", type=int, default=1, help="torch threads of the process")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    service = ServiceClient()
    trainer = service.create_lora_training_client(DEMO_MODEL, rank=16, seed=0).result()
    sampler = service.create_sampling_client(base_model=DEMO_MODEL)
    adam = types.AdamParams(learning_rate=1e-4)
    rng = np.random.default_rng(0)
    data = [datum(turns * 75, rng) for turns in TURNS]
    minibatches = [data[i : i + 8] for i in range(0, len(data), 8)]

    def two_steps() -> float:
        """The mean time of two training steps."""
        started = time.perf_counter()
        for _ in range(2):
            for part in minibatches:
                trainer.forward_backward(part, "ppo").result()
                trainer.optim_step(adam).result()
        return (time.perf_counter() - started) / 2

    context = mp.get_context("spawn")
    steps: dict[str, list[float]] = {"alone": [], "thread": [], "process": []}
    rates: dict[str, list[float]] = {"alone": [], "thread": [], "process": []}  # alone: no training
    two_steps()  # warm up
    for round_ in range(args.rounds):
        order = list(steps)
        random.Random(round_).shuffle(order)
        for place in order:
            if place == "alone":
                steps[place].append(two_steps())
                count, end = thread_load(sampler)
                time.sleep(0.5)
                rates["alone"].append(under_load(count, idle)[1])
            else:
                count, end = (
                    thread_load(sampler) if place == "thread" else process_load(context, args.sampler_threads)
                )
                time.sleep(0.5)
                seconds, rate = under_load(count, two_steps)
                steps[place].append(seconds)
                rates[place].append(rate)
            end()
        print(
            f"round {round_}: step " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in steps.items())
            + "; sampler " + ", ".join(f"{k} {v[-1]:.0f} tok/s" for k, v in rates.items()),
            flush=True,
        )  # fmt: skip
    print(f"{args.rounds} rounds, sampler process with {args.sampler_threads} torch thread(s):")
    print("  median step: " + ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in steps.items()))
    print("  median sampler: " + ", ".join(f"{k} {statistics.median(v):.0f} tok/s" for k, v in rates.items()))
    what = f"median of {args.rounds} rounds"
    for place in steps:
        doing = "no sampler" if place == "alone" else f"sampler in a {place}"
        result.add(f"{place}_step_s", statistics.median(steps[place]), "s", f"training step, {doing}, {what}")
        doing = "no training" if place == "alone" else f"in a {place}, under training"
        result.add(f"{place}_sampler_tok_s", statistics.median(rates[place]), "tokens/s", f"sampler, {doing}")
    result.save()


if __name__ == "__main__":
    main()
