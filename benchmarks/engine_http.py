"""What serving the engine over Tinker's HTTP API costs: `tinkertrace engine` vs the in-process engine.

One run measures, side by side on the same model and data, in interleaved pairs (the order within a
pair alternates, so drift on a shared machine hits both paths alike):

* a training step (``forward_backward`` + ``optim_step``, both submitted, then both awaited) on the
  demo's batch: 4 groups x 8 rollouts of the built-in ``small`` model (LoRA rank 16), ~120 tokens each,
  ``importance_sampling`` loss;
* a sampling call as the demo's endpoint makes it: 8 samples of 20 tokens from one chat prompt (the same
  seed on both paths, so both generate the same tokens).

The HTTP path is the real ``tinker.ServiceClient`` talking to a `tinkertrace engine` child process on
a loopback port; the in-process path is ``tinkertrace.engine.ServiceClient``. Both use one torch
thread (``--threads``).

    .venv/bin/python benchmarks/engine_http.py --pairs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import record
import tinker
from rich.console import Console
from rich.table import Table
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.engine_server.process import EngineProcess
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer

MEASURES = ("src/tinkertrace/engine", "src/tinkertrace/engine_server", "src/tinkertrace/models")

MODEL = f"{BUILTIN_MODEL}:small"


def demo_batch(num_datums: int, length: int, seed: int = 0) -> list[types.Datum]:
    """``num_datums`` importance-sampling Datums of ``length`` tokens (prompt then a sampled reply)."""
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(num_datums):
        tokens = rng.integers(32, 127, size=length + 1).tolist()
        reply = np.zeros(length, dtype=np.float32)
        reply[-20:] = 1.0
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": (-5.5 * reply).tolist(),
                    "advantages": (reply * rng.choice([-1.0, 1.0])).tolist(),
                },
            )
        )
    return data


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(
    a: Callable[[], Any], b: Callable[[], Any], pairs: int, warmup: int
) -> tuple[list[float], list[float]]:
    """Times of ``a`` and ``b`` over ``pairs`` pairs, alternating which runs first."""
    for _ in range(warmup):
        a(), b()
    times_a, times_b = [], []
    for i in range(pairs):
        if i % 2 == 0:
            times_a.append(timed(a))
            times_b.append(timed(b))
        else:
            times_b.append(timed(b))
            times_a.append(timed(a))
    return times_a, times_b


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=15, help="measured pairs per operation")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured pairs first")
    parser.add_argument("--datums", type=int, default=32, help="Datums per training batch (demo: 4 x 8)")
    parser.add_argument("--length", type=int, default=120, help="tokens per Datum")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    os.environ["TINKERTRACE_CPU_THREADS"] = str(args.threads)
    console = Console()
    data = demo_batch(args.datums, args.length)
    adam = types.AdamParams(learning_rate=1e-4)
    tokenizer = load_tokenizer(MODEL)
    prompt = types.ModelInput.from_ints(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Who are you? Answer in one short sentence."}],
            add_generation_prompt=True,
            return_dict=False,
        )
    )
    params = types.SamplingParams(max_tokens=20, temperature=1.0, seed=1234)

    with tempfile.TemporaryDirectory() as tmp:
        local = ServiceClient(Path(tmp) / "local", cpu_threads=args.threads)
        with EngineProcess(Path(tmp) / "served", cpu_threads=args.threads) as engine:
            remote = tinker.ServiceClient(base_url=engine.url, api_key=engine.api_key)
            trainers = [
                s.create_lora_training_client(MODEL, rank=16, seed=0).result() for s in (local, remote)
            ]
            samplers = [s.create_sampling_client(base_model=MODEL).result() for s in (local, remote)]

            def step(trainer: Any) -> Callable[[], None]:
                def run() -> None:
                    fwd_bwd = trainer.forward_backward(data, "importance_sampling")
                    optim = trainer.optim_step(adam)
                    fwd_bwd.result()
                    optim.result()

                return run

            def sample(sampler: Any) -> Callable[[], None]:
                return lambda: sampler.sample(prompt, 8, params).result()

            train_times = interleaved(step(trainers[0]), step(trainers[1]), args.pairs, args.warmup)
            sample_times = interleaved(sample(samplers[0]), sample(samplers[1]), args.pairs, args.warmup)
            remote.close("success").result()

    table = Table(
        title=f"{MODEL}: in-process engine vs tinkertrace engine over HTTP (median of {args.pairs} pairs)"
    )
    for column in ("operation", "in-process ms", "HTTP ms", "HTTP / in-process", "median pair ratio"):
        table.add_column(column, justify="right")
    rows = [
        (f"train step ({args.datums} x {args.length} tokens)", train_times),
        ("sample (8 x 20 tokens)", sample_times),
    ]
    for name, (in_process, http) in rows:
        ratio = statistics.median(http) / statistics.median(in_process)
        pair = statistics.median(h / i for h, i in zip(http, in_process, strict=True))
        table.add_row(
            name,
            f"{statistics.median(in_process) * 1000:.1f}",
            f"{statistics.median(http) * 1000:.1f}",
            f"{ratio:.3f}",
            f"{pair:.3f}",
        )
        key = "train" if name.startswith("train") else "sample"
        result.add(f"{key}_in_process_ms", statistics.median(in_process) * 1000, "ms", f"{name}: in-process")
        result.add(f"{key}_http_ms", statistics.median(http) * 1000, "ms", f"{name}: over HTTP")
        result.add(f"{key}_http_ratio", pair, "×", f"{name}: HTTP / in-process, median of {args.pairs} pairs")
    console.print(table)
    result.save()


if __name__ == "__main__":
    main()
