"""Local engine speed: forward_backward + optim_step, a plain PyTorch loop on the same batch, sampling.

Prints, per built-in size: training tokens/s through the engine (full fine-tuning and LoRA), the
same step written as a plain PyTorch loop (and the engine/plain ratio), and sampling tokens/s.
Uses CUDA when available.

    .venv/bin/python benchmarks/engine_step.py --sizes nano small base --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from tinker import types

from tinkertrace.engine import BUILTIN_SIZES, ServiceClient
from tinkertrace.engine.model import load_base_model, parameter_count
from tinkertrace.tokenizer import BUILTIN_MODEL


def make_batch(batch: int, seq_len: int, vocab: int, seed: int = 0) -> list[types.Datum]:
    """Random token sequences as cross-entropy Datums (weight 1 everywhere)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, size=(batch, seq_len + 1))
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(row[:-1].tolist()),
            loss_fn_inputs={"target_tokens": row[1:], "weights": np.ones(seq_len, np.float32)},
        )
        for row in tokens
    ]


def timed(fn: Callable[[], object], steps: int, warmup: int = 2) -> float:
    """Median seconds per call after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engine_step_seconds(
    service: ServiceClient, model: str, rank: int, data: list[types.Datum], steps: int
) -> float:
    client = service.create_lora_training_client(model, rank=rank, seed=0).result()
    params = types.AdamParams(learning_rate=1e-3)

    def step() -> None:
        fb = client.forward_backward(data, "cross_entropy")
        opt = client.optim_step(params)
        fb.result()
        opt.result()

    return timed(step, steps)


def plain_step_seconds(model_name: str, data: list[types.Datum], device: torch.device, steps: int) -> float:
    """The same step written directly in PyTorch: forward, summed token NLL, backward, AdamW."""
    model = load_base_model(model_name, device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    ids = torch.tensor([d.model_input.to_ints() for d in data], device=device)
    targets = torch.tensor(
        np.stack([d.loss_fn_inputs["target_tokens"].to_numpy() for d in data]), device=device
    )

    def one_step() -> None:
        logits = model(input_ids=ids).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="sum")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())

    # run on a worker thread like the engine does, so both see the same threading conditions
    with ThreadPoolExecutor(max_workers=1) as pool:
        return timed(lambda: pool.submit(one_step).result(), steps)


def sampling_tokens_per_s(service: ServiceClient, model: str, num_samples: int, max_tokens: int) -> float:
    sampler = service.create_sampling_client(base_model=model).result()
    prompt = types.ModelInput.from_ints(list(b"<|im_start|>user\nhello<|im_end|>\n"))
    params = types.SamplingParams(max_tokens=max_tokens, seed=0, stop=[])
    counts: list[int] = []

    def run() -> None:
        response = sampler.sample(prompt, num_samples, params).result()
        counts.append(sum(len(s.tokens) for s in response.sequences))

    seconds = timed(run, steps=3, warmup=1)
    return statistics.median(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", nargs="+", default=["nano", "small", "base"], choices=sorted(BUILTIN_SIZES)
    )
    parser.add_argument("--batch", type=int, default=8, help="sequences per training step")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    parser.add_argument("--lora-rank", type=int, default=8, help="LoRA rank for the LoRA row")
    parser.add_argument("--samples", type=int, default=8, help="num_samples per sampling request")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per sample")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args()

    console = Console(width=150)
    with tempfile.TemporaryDirectory() as tmp:
        service = ServiceClient(tmp, device=args.device, cpu_threads=args.threads)
        device = service.device
        table = Table(
            title=f"{BUILTIN_MODEL} on the local engine, {device} ({torch.get_num_threads()} CPU threads), "
            f"training batch {args.batch} x {args.seq_len} tokens"
        )
        for col in (
            "size",
            "params",
            "full FT tok/s",
            "plain torch tok/s",
            "engine/plain",
            f"LoRA r{args.lora_rank} tok/s",
            "step ms (full)",
            f"sample tok/s (n={args.samples})",
        ):
            table.add_column(col, justify="right")
        data = make_batch(args.batch, args.seq_len, vocab=256)
        tokens = args.batch * args.seq_len
        for size in args.sizes:
            name = f"{BUILTIN_MODEL}:{size}"
            params = parameter_count(load_base_model(name, device))
            full = engine_step_seconds(service, name, 0, data, args.steps)
            plain = plain_step_seconds(name, data, device, args.steps)
            lora = engine_step_seconds(service, name, args.lora_rank, data, args.steps)
            sample = sampling_tokens_per_s(service, name, args.samples, args.max_tokens)
            table.add_row(
                size,
                f"{params / 1e6:.2f}M",
                f"{tokens / full:,.0f}",
                f"{tokens / plain:,.0f}",
                f"{plain / full:.2f}",
                f"{tokens / lora:,.0f}",
                f"{full * 1000:.1f}",
                f"{sample:,.0f}",
            )
        console.print(table)


if __name__ == "__main__":
    main()
