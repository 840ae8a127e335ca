"""A LoRA RL step through the local engine vs the same step written in plain PyTorch + peft.

Both train the same model with the same LoRA (rank, alpha, target modules, seed) and AdamW on one
real batch: chat conversations rendered by the model's own template and tokenised by its tokenizer,
with the importance-sampling loss (the policy-gradient loss the loop uses). Steps alternate engine /
plain (interleaved pairs, after one warm-up step each) so both see the same machine load; the ratio
engine/plain of the median step times is printed (the issue's target: <= 1.1).

    .venv/bin/python benchmarks/lora_step.py --model smollm2-135m-instruct --pairs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import record
import torch
from peft import LoraConfig, get_peft_model
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.engine.model import LORA_ALPHA, load_base_model, lora_target_modules
from tinkertrace.models.tokenizer import load_tokenizer

MEASURES = ("src/tinkertrace/engine", "src/tinkertrace/models")

TOPICS = ("the sea", "rain", "a forest", "the moon", "bread", "winter", "a train", "the stars")


def real_batch(model: str, batch: int, seq_len: int) -> list[types.Datum]:
    """Chat conversations in the model's template, cut or padded by repetition to ``seq_len`` + 1 tokens,
    as RL Datums (sampling logprobs -1, advantages +-1 on the reply half)."""
    tok = load_tokenizer(model)
    rng = np.random.default_rng(0)
    data = []
    for i in range(batch):
        topic = TOPICS[i % len(TOPICS)]
        messages = [
            {"role": "user", "content": f"Tell me about {topic}."},
            {
                "role": "assistant",
                "content": f"{topic.capitalize()} is something many people write about. " * 8,
            },
        ]
        text = tok.apply_chat_template(messages, tokenize=False)
        ids = list(tok.encode(text, add_special_tokens=False))
        ids = (ids * (seq_len // len(ids) + 2))[: seq_len + 1]
        advantages = np.zeros(seq_len, np.float32)
        advantages[seq_len // 2 :] = rng.choice([-1.0, 1.0])
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={
                    "target_tokens": np.asarray(ids[1:], np.int64),
                    "logprobs": np.full(seq_len, -1.0, np.float32),
                    "advantages": advantages,
                },
            )
        )
    return data


def plain_step(model_name: str, rank: int, data: list[types.Datum], device: torch.device):
    """The step in plain PyTorch + peft: token logprobs, importance-sampling loss, backward, AdamW."""
    base = load_base_model(model_name, device)
    config = LoraConfig(
        r=rank,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=lora_target_modules(base, True, True, True),
        bias="none",
    )
    torch.manual_seed(0)
    model = get_peft_model(base, config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
    ids = torch.tensor([d.model_input.to_ints() for d in data], device=device)

    def column(key: str) -> torch.Tensor:
        return torch.tensor(np.stack([d.loss_fn_inputs[key].to_numpy() for d in data]), device=device)

    targets, sampling_lp, advantages = column("target_tokens"), column("logprobs"), column("advantages")

    def step() -> None:
        logits = model(input_ids=ids).logits.float()
        lp = -torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        loss = -(torch.exp(lp - sampling_lp) * advantages).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())

    return step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TINKERTRACE_CPU_THREADS") or 2))
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    data = real_batch(args.model, args.batch, args.seq_len)
    with tempfile.TemporaryDirectory() as tmp:
        service = ServiceClient(tmp, cpu_threads=args.threads)
        client = service.create_lora_training_client(args.model, rank=args.rank, seed=0).result()
        adam = types.AdamParams(learning_rate=1e-4)

        def engine() -> None:
            fb = client.forward_backward(data, "importance_sampling")
            opt = client.optim_step(adam)
            fb.result()
            opt.result()

        plain = plain_step(args.model, args.rank, data, service.device)
        with ThreadPoolExecutor(max_workers=1) as pool:  # a worker thread, as the engine uses
            runs = {"engine": engine, "plain torch+peft": lambda: pool.submit(plain).result()}
            times: dict[str, list[float]] = {name: [] for name in runs}
            for pair in range(args.pairs + 1):
                for name, run in runs.items():
                    start = time.perf_counter()
                    run()
                    if pair:  # the first pair warms up
                        times[name].append(time.perf_counter() - start)
    tokens = args.batch * args.seq_len
    print(
        f"{args.model}, LoRA rank {args.rank}, batch {args.batch} x {args.seq_len} tokens, "
        f"{args.threads} torch threads, device {service.device}, load {os.getloadavg()}"
    )
    for name, values in times.items():
        print(
            f"  {name:18s} steps {', '.join(f'{v:.2f}' for v in values)} s; "
            f"median {statistics.median(values):.2f} s"
            f" ({tokens / statistics.median(values):,.0f} tokens/s)"
        )
    ratio = statistics.median(times["engine"]) / statistics.median(times["plain torch+peft"])
    pairwise = [e / p for e, p in zip(times["engine"], times["plain torch+peft"], strict=True)]
    print(f"  engine / plain: {ratio:.2f} (pairwise {', '.join(f'{r:.2f}' for r in pairwise)})")
    what = f"{args.model}, LoRA r{args.rank}, batch {args.batch} x {args.seq_len}"
    result.add("engine_step_s", statistics.median(times["engine"]), "s", f"{what}: engine, median step")
    result.add(
        "plain_step_s", statistics.median(times["plain torch+peft"]), "s", f"{what}: torch+peft, median"
    )
    result.add("engine_over_plain", ratio, "×", f"median step ratio of {args.pairs} pairs (target <= 1.1)")
    result.save()


if __name__ == "__main__":
    main()
