"""In-flight weight updates: keep the running sequences' KV cache, or recompute it under the new weights?

A batch of ``--rows`` sequences (different prompts) is decoded by the local engine's continuous batcher
while new weights are published every ``--every`` decoding steps (two real weight sets, a LoRA run's
weights before and after one Adam step at ``--learning-rate``, published alternately as versions 0,
1, 2, ...; the demo's learning rates are 3e-3 on the built-in model and 1e-3 on SmolLM2). Both
modes run interleaved, round by round, on the same prompts and seed:

* ``keep``: the cache computed under earlier weights is kept (no extra work; slightly off-policy);
* ``recompute``: at each update the running rows' cache is rebuilt under the new weights (one prefill
  pass over each row's prompt and tokens so far).

Reported per mode: tokens/s, the time of the recompute passes, and how far each token's sampler logprob
is from the logprob the weights that sampled it give the same sequence with a cache of their own
(teacher-forced, one forward pass per version): the mean and largest absolute difference over the
tokens sampled after the first update, and the mismatch KL estimate mean(sampler lp − recomputed lp).

    .venv/bin/python benchmarks/inflight_cache.py --rows 16 --max-tokens 64 --every 16 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import record
import torch
from rich.console import Console
from rich.table import Table
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.engine.continuous import ContinuousBatcher
from tinkertrace.engine.decoding import DecodeRequest
from tinkertrace.models.tokenizer import BUILTIN_MODEL

MEASURES = ("src/tinkertrace/engine", "src/tinkertrace/models")

TOPICS = ("the sea", "a forest", "rain", "the moon", "winter", "a river", "bread", "a garden", "thunder")


def two_weight_sets(service: ServiceClient, model: str, lr: float) -> tuple[Any, Any, Any]:
    """The tokenizer and two inference models: a LoRA run's weights before and after one step."""
    trainer = service.create_lora_training_client(model, rank=8, seed=0).result()
    tok = trainer.get_tokenizer()
    before = trainer.save_weights_and_get_sampling_client().result()
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello there<|im_end|>\n")
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=lr)).result()
    after = trainer.save_weights_and_get_sampling_client().result()
    return tok, before.model, after.model


def run(models: tuple[Any, Any], tok: Any, prompts: list[list[int]], args: Any, recompute: bool) -> dict:
    """Decode ``prompts`` with an update every ``args.every`` steps; timings and the sequences."""
    batcher = ContinuousBatcher(models[0], tok)
    steps = [0]

    def publish(*_: Any) -> None:
        steps[0] += 1
        if steps[0] % args.every == 0:
            version = steps[0] // args.every
            batcher.update_weights(models[version % 2], version, recompute)

    hooks = [m.register_forward_hook(publish) for m in models]
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=args.seed)
    requests = [DecodeRequest.build(models[0], tok, p, 1, params) for p in prompts]
    recompute_s = [0.0]
    original = batcher._recompute

    def timed(batch: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(batch)
        finally:
            recompute_s[0] += time.perf_counter() - start

    batcher._recompute = timed  # type: ignore[method-assign]
    start = time.perf_counter()
    futures = [batcher.submit(r) for r in requests]
    sequences = [f.result()[0] for f in futures]
    seconds = time.perf_counter() - start
    for hook in hooks:
        hook.remove()
    batcher.close()
    tokens = sum(len(s.tokens) for s in sequences)
    return {"seconds": seconds, "tokens": tokens, "updates": batcher.updates, "recompute_s": recompute_s[0],
            "sequences": sequences}  # fmt: skip


@torch.inference_mode()
def mismatch(models: tuple[Any, Any], prompts: list[list[int]], sequences: list[Any]) -> np.ndarray:
    """Per token sampled after the first update: sampler logprob − the logprob its version's weights
    give it with their own cache (a teacher-forced pass over prompt + tokens)."""
    diffs = []
    for prompt, seq in zip(prompts, sequences, strict=True):
        versions = np.asarray(seq.policy_versions)
        ids = torch.tensor([prompt + list(seq.tokens)])
        for version in np.unique(versions[versions > 0]):
            rows = torch.log_softmax(models[version % 2](input_ids=ids[:, :-1]).logits[0].float(), -1)
            at = np.flatnonzero(versions == version)
            got = rows[len(prompt) - 1 + at].gather(-1, ids[0, len(prompt) + at][:, None])[:, 0].numpy()
            diffs.append(np.asarray(seq.logprobs)[at] - got)
    return np.concatenate(diffs) if diffs else np.zeros(0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=BUILTIN_MODEL)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--every", type=int, default=16, help="decoding steps between two updates")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--learning-rate", type=float, default=3e-3, help="of the one step between the two weight sets"
    )
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TINKERTRACE_CPU_THREADS") or 2))
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        service = ServiceClient(Path(folder), device="cpu", cpu_threads=args.threads)
        tok, before, after = two_weight_sets(service, args.model, args.learning_rate)
        models = (before, after)
        chats = [[{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}, story {i}."}]
                 for i in range(args.rows)]  # fmt: skip
        texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
        prompts = [list(tok.encode(t, add_special_tokens=False)) for t in texts]
        title = f"updates every {args.every} steps, {args.rows} rows, {args.model}, lr {args.learning_rate:g}"
        table = Table(title=title)
        for column in ("round", "mode", "tokens", "updates", "s", "tok/s", "recompute s", "|Δlp| mean",
                       "|Δlp| max", "mismatch KL"):  # fmt: skip
            table.add_column(column, justify="right")
        run(models, tok, prompts, args, False)  # warm-up (the first full batch is slow): not reported
        rates: dict[str, list[float]] = {"keep": [], "recompute": []}
        kls: dict[str, list[float]] = {"keep": [], "recompute": []}
        for r in range(args.rounds):
            for mode in ("keep", "recompute") if r % 2 == 0 else ("recompute", "keep"):
                out = run(models, tok, prompts, args, mode == "recompute")
                d = mismatch(models, prompts, out["sequences"])
                rates[mode].append(out["tokens"] / out["seconds"])
                if d.size:
                    kls[mode].append(float(d.mean()))
                table.add_row(
                    str(r), mode, str(out["tokens"]), str(out["updates"]), f"{out['seconds']:.2f}",
                    f"{out['tokens'] / out['seconds']:.1f}", f"{out['recompute_s']:.2f}",
                    f"{np.abs(d).mean():.2e}" if d.size else "-", f"{np.abs(d).max():.2e}" if d.size else "-",
                    f"{d.mean():.2e}" if d.size else "-",
                )  # fmt: skip
        Console(width=200).print(table)
        service.close()
    what = f"{args.model}, {args.rows} rows, updates every {args.every} steps"
    for mode in rates:
        result.add(f"{mode}_tok_s", statistics.median(rates[mode]), "tokens/s", f"{mode}: {what}, median")
        if kls[mode]:
            result.add(
                f"{mode}_mismatch_kl", statistics.median(kls[mode]), "", f"{mode}: mismatch KL, median"
            )
    result.save()


if __name__ == "__main__":
    main()
