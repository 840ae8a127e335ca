"""Forward/backward on batches of mixed lengths: one pass padded to the longest row, against rows grouped
by length (the engine's :func:`~tinkertrace.engine.batching.microbatches`).

The batches imitate the long-tail task's trajectories (``examples/long_tail``): a rollout's length is
its number of turns, drawn from that task's ``k^-1.5`` law over 1..10, times ``--turn-tokens`` tokens.
Each round draws a fresh batch and times one ``forward_backward`` + ``optim_step`` per minibatch, as a
follow step with ``--substeps`` substeps does, once each way in alternating order (interleaved pairs
on one client; the way changes only how rows are split into passes). Prints each way's median step
time, the padded tokens it computed, and the ratio.

    .venv/bin/python benchmarks/length_grouping.py --rounds 10
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import record
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.engine.batching import microbatches
from tinkertrace.models.builtin import DEMO_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the examples package, run as a script

from examples.long_tail.agent import MAX_TURNS, turn_weights

MEASURES = ("src/tinkertrace/engine", "src/tinkertrace/models")

ONE_PASS = 10**12  # pass_tokens that never starts another pass: one pass padded to the longest row


def datum(length: int, rng: np.random.Generator) -> types.Datum:
    """A policy-gradient Datum of ``length`` tokens (random ids of the byte vocabulary)."""
    tokens = rng.integers(0, 250, length + 1)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": tokens[1:].astype(np.int64),
            "logprobs": np.full(length, -3.0, np.float32),
            "advantages": rng.normal(size=length).astype(np.float32),
        },
    )


def padded_tokens(lengths: list[int], budget: int, pass_tokens: int) -> int:
    passes = microbatches(lengths, budget, pass_tokens)
    return sum(len(rows) * max(lengths[r] for r in rows) for rows in passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved pairs")
    parser.add_argument("--rollouts", type=int, default=32, help="Datums per step")
    parser.add_argument("--substeps", type=int, default=4, help="minibatches per step")
    parser.add_argument("--turn-tokens", type=int, default=75, help="tokens per turn of a trajectory")
    parser.add_argument("--device", default=None)
    parser.add_argument("--pass-tokens", type=int, default=None, help="the grouped way's (default: engine's)")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    service = ServiceClient(device=args.device)
    client = service.create_lora_training_client(args.model, rank=16, seed=0).result()
    adam = types.AdamParams(learning_rate=1e-4)
    draw = random.Random(0)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {"one pass": [], "grouped": []}
    padded: dict[str, int] = {"one pass": 0, "grouped": 0}
    real = 0
    for pair in range(args.rounds):
        turns = draw.choices(range(1, MAX_TURNS + 1), weights=turn_weights(), k=args.rollouts)
        lengths = [t * args.turn_tokens for t in turns]
        data = [datum(n, rng) for n in lengths]
        real += sum(lengths)
        size = args.rollouts // args.substeps
        minibatches = [data[i : i + size] for i in range(0, len(data), size)]
        ways = [("one pass", ONE_PASS), ("grouped", args.pass_tokens or client.pass_tokens)]
        for name, pass_tokens in ways if pair % 2 else ways[::-1]:
            saved, client.pass_tokens = client.pass_tokens, pass_tokens
            started = time.perf_counter()
            for part in minibatches:
                client.forward_backward(part, "ppo").result()
                client.optim_step(adam).result()
            times[name].append(time.perf_counter() - started)
            client.pass_tokens = saved
            padded[name] += sum(
                padded_tokens(lengths[i : i + size], client.microbatch_tokens, pass_tokens)
                for i in range(0, len(lengths), size)
            )
    print(
        f"model {args.model}, {args.rollouts} rollouts × {args.turn_tokens} tokens per turn, "
        f"{args.substeps} minibatches, {args.rounds} interleaved pairs; real tokens {real}"
    )
    for name, values in times.items():
        print(
            f"  {name:9} median step {statistics.median(values):.3f} s "
            f"(min {min(values):.3f}, max {max(values):.3f}); padded tokens {padded[name]} "
            f"({padded[name] / real:.2f}× the real)"
        )
    ratio = statistics.median(g / o for g, o in zip(times["grouped"], times["one pass"], strict=True))
    print(f"  grouped / one pass, median of the pairs: {ratio:.2f}")
    for name, values in times.items():
        key = name.replace(" ", "_")
        what = f"{args.model}, {args.rollouts} rollouts, {args.substeps} minibatches"
        result.add(f"{key}_step_s", statistics.median(values), "s", f"{name}: median step, {what}")
        result.add(f"{key}_padding", padded[name] / real, "× real", f"{name}: padded tokens / real tokens")
    result.add("grouped_over_one_pass", ratio, "×", f"step time ratio, median of {args.rounds} pairs")
    result.save()


if __name__ == "__main__":
    main()
