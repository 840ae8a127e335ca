"""Local engine speed: forward_backward + optim_step, a plain PyTorch loop on the same batch, sampling.

Prints, per model: training tokens/s through the engine (full fine-tuning and LoRA), the same step
written as a plain PyTorch loop (and the engine/plain ratio), and sampling tokens/s. Uses CUDA when
available. Models are built-in sizes, local Hugging Face folders, or randomly initialised Llama
shapes written to a temporary folder (``--random HIDDENxLAYERS``; nothing is downloaded), which
measure the engine on larger models, e.g. on a GPU:

    .venv/bin/python benchmarks/engine_step.py --sizes nano small base --threads 1
    python benchmarks/engine_step.py --sizes --random 1024x16 2048x16 --skip-full
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import record
import torch
from rich.console import Console
from rich.table import Table
from tinker import types
from transformers import LlamaConfig, LlamaForCausalLM

from tinkertrace.engine import BUILTIN_SIZES, ServiceClient
from tinkertrace.engine.model import load_base_model, parameter_count
from tinkertrace.models.tokenizer import BUILTIN_MODEL, builtin_tokenizer

MEASURES = ("src/tinkertrace/engine", "src/tinkertrace/models")

HEAD_DIM = 64
"""Head size of the ``--random`` shapes (as in Llama-style models of a few hundred million weights)."""


def write_random_llama(folder: Path, shape: str, vocab_size: int) -> Path:
    """A randomly initialised Llama of ``HIDDENxLAYERS`` with the built-in tokenizer, saved to ``folder``.

    The vocabulary is ``vocab_size`` (the tokenizer covers its first ids), so the unembedding costs
    what a real model's does; the MLP is 8/3 of the hidden size, as in Llama.
    """
    hidden, layers = (int(x) for x in shape.lower().split("x"))
    tokenizer = builtin_tokenizer()
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=(hidden * 8 // 3 + 255) // 256 * 256,
        num_hidden_layers=layers,
        num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=hidden // HEAD_DIM,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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
        "--sizes", nargs="*", default=["nano", "small", "base"], choices=sorted(BUILTIN_SIZES)
    )
    parser.add_argument("--models", nargs="*", default=[], help="local Hugging Face model folders")
    parser.add_argument(
        "--random", nargs="*", default=[], metavar="HIDDENxLAYERS", help="random Llama shapes, e.g. 1024x16"
    )
    parser.add_argument("--vocab", type=int, default=32_000, help="vocabulary of the --random shapes")
    parser.add_argument("--skip-full", action="store_true", help="skip full fine-tuning (LoRA rows only)")
    parser.add_argument(
        "--matmul-precision",
        choices=["highest", "high", "medium"],
        default=None,
        help="torch.set_float32_matmul_precision (high = TF32 on CUDA); default: torch's",
    )
    parser.add_argument("--batch", type=int, default=8, help="sequences per training step")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    parser.add_argument("--lora-rank", type=int, default=8, help="LoRA rank for the LoRA row")
    parser.add_argument("--samples", type=int, default=8, help="num_samples per sampling request")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per sample")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(
        __file__,
        MEASURES,
        args,
        variant="cuda" if (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda" else "",
    )

    if args.matmul_precision:
        torch.set_float32_matmul_precision(args.matmul_precision)
    console = Console(width=150)
    with tempfile.TemporaryDirectory() as tmp:
        service = ServiceClient(tmp, device=args.device, cpu_threads=args.threads)
        device = service.device
        models = [(size, f"{BUILTIN_MODEL}:{size}") for size in args.sizes]
        models += [(Path(folder).name, folder) for folder in args.models]
        for shape in args.random:
            folder = write_random_llama(Path(tmp) / f"llama-{shape}", shape, args.vocab)
            models.append((f"llama {shape}", str(folder)))
        precision = torch.get_float32_matmul_precision()
        table = Table(
            title=f"The local engine on {device} ({torch.get_num_threads()} CPU threads, float32 matmul "
            f"precision {precision}), training batch {args.batch} x {args.seq_len} tokens"
        )
        for col in (
            "model",
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
        for label, name in models:
            params = parameter_count(load_base_model(name, device))
            full = plain = None
            if not args.skip_full:
                full = engine_step_seconds(service, name, 0, data, args.steps)
                plain = plain_step_seconds(name, data, device, args.steps)
            lora = engine_step_seconds(service, name, args.lora_rank, data, args.steps)
            sample = sampling_tokens_per_s(service, name, args.samples, args.max_tokens)
            table.add_row(
                label,
                f"{params / 1e6:.2f}M",
                f"{tokens / full:,.0f}" if full else "-",
                f"{tokens / plain:,.0f}" if plain else "-",
                f"{plain / full:.2f}" if full and plain else "-",
                f"{tokens / lora:,.0f}",
                f"{full * 1000:.1f}" if full else "-",
                f"{sample:,.0f}",
            )
            key, what = record.slug(label), f"{label} on {device}, batch {args.batch} x {args.seq_len}"
            if full and plain:
                result.add(f"{key}_full_tok_s", tokens / full, "tokens/s", f"{what}: full fine-tuning step")
                result.add(f"{key}_plain_tok_s", tokens / plain, "tokens/s", f"{what}: plain PyTorch step")
            result.add(f"{key}_lora_tok_s", tokens / lora, "tokens/s", f"{what}: LoRA r{args.lora_rank} step")
            result.add(f"{key}_sample_tok_s", sample, "tokens/s", f"{label}: sampling, n={args.samples}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        console.print(table)
    result.save()


if __name__ == "__main__":
    main()
