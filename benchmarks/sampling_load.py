"""Sampling under agents' load: N concurrent agents with different prompts through the real endpoint.

Three ways to produce the same completions, interleaved round by round on one machine:

* ``one at a time``: the endpoint answering one request after another (a single agent);
* ``N concurrent``: N AsyncOpenAI clients, each with its own question, hitting the endpoint at once
  (the local engine's continuous batcher decodes them in one batch);
* ``generate, padded``: transformers' ``generate`` on the same N prompts as one left-padded batch,
  in process (the reference the issue sets: concurrent agents should reach >= 0.9x of it).

Tokens/s counts the tokens each completion really has (through its end-of-sequence token; ``generate``
keeps computing finished rows, those padding tokens are not counted).

    .venv/bin/python benchmarks/sampling_load.py --model smollm2-135m-instruct --agents 16 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import openai
import record
import torch
from rich.console import Console
from rich.table import Table

from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder

MEASURES = ("src/tinkertrace/engine", "src/tinkertrace/models", "src/tinkertrace/serving")

TOPICS = (
    "the sea", "a forest", "mountains", "rain", "the moon", "a city at night", "winter", "a river",
    "the desert", "a library", "bread", "a garden", "thunder", "a train", "the stars", "autumn",
    "a lighthouse", "snow", "a market", "the wind", "an island", "a bridge", "a clock", "the sun",
)  # fmt: skip


def questions(n: int) -> list[str]:
    """N different questions (different lengths and words)."""
    return [f"Write two sentences about {TOPICS[i % len(TOPICS)]}, number {i}." for i in range(n)]


async def endpoint_round(url: str, model: str, prompts: list[str], max_tokens: int, concurrent: bool) -> int:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

    async def ask(text: str) -> int:
        resp = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=1.0
        )
        return len(resp.choices[0].model_extra["token_ids"])

    if concurrent:
        counts = await asyncio.gather(*(ask(p) for p in prompts))
    else:
        counts = [await ask(p) for p in prompts]
    await client.close()
    return sum(counts)


@torch.inference_mode()
def generate_round(model: torch.nn.Module, tokenizer, prompts: list[str], max_tokens: int) -> int:
    """Padded ``generate`` on all prompts at once; returns the real (pre-EOS) tokens generated."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    new = out[:, batch["input_ids"].shape[1] :]
    eos = new == tokenizer.eos_token_id
    lengths = torch.where(eos.any(-1), eos.float().argmax(-1) + 1, new.shape[1])
    return int(lengths.sum())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--single", type=int, default=4, help="requests in the one-at-a-time round")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TINKERTRACE_CPU_THREADS") or 2))
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    torch.set_num_threads(args.threads)
    service = ServiceClient()
    sampler = service.create_sampling_client(base_model=args.model).result()
    tokenizer = load_tokenizer(args.model)
    policy = PolicyHolder(sampler, tokenizer, args.model)
    prompts = questions(args.agents)
    rows: list[tuple[int, str, int, float]] = []
    with BackgroundServer(create_app(policy, default_max_tokens=args.max_tokens)) as server:
        asyncio.run(endpoint_round(server.url, args.model, prompts[:2], 4, concurrent=True))  # warm up
        for r in range(args.rounds):
            for name, run in (
                ("one at a time", lambda: asyncio.run(
                    endpoint_round(server.url, args.model, prompts[: args.single], args.max_tokens, False))),
                (f"{args.agents} concurrent", lambda: asyncio.run(
                    endpoint_round(server.url, args.model, prompts, args.max_tokens, True))),
                ("generate, padded", lambda: generate_round(
                    sampler.model, tokenizer, prompts, args.max_tokens)),
            ):  # fmt: skip
                start = time.perf_counter()
                tokens = run()
                rows.append((r, name, tokens, time.perf_counter() - start))
    table = Table(
        title=f"{args.model}, {args.threads} torch threads, device {service.device}, load {os.getloadavg()}"
    )
    for col in ("round", "mode", "tokens", "seconds", "tokens/s"):
        table.add_column(col)
    for r, name, tokens, seconds in rows:
        table.add_row(str(r), name, str(tokens), f"{seconds:.1f}", f"{tokens / seconds:.1f}")
    Console().print(table)
    fill = sampler.decoder.rows_stepped / max(sampler.decoder.steps, 1)
    print(
        f"continuous batcher: {sampler.decoder.prefills} prefills, {sampler.decoder.steps} steps, "
        f"mean {fill:.1f} rows per step"
    )
    for mode in dict.fromkeys(name for _, name, _, _ in rows):
        rate = statistics.median(t / s for _, name, t, s in rows if name == mode)
        key = "concurrent" if "concurrent" in mode else record.slug(mode)
        result.add(f"{key}_tok_s", rate, "tokens/s", f"{args.model}: {mode}, median of {args.rounds} rounds")
    result.add("rows_per_step", fill, "rows", "continuous batcher: mean rows per decoding step")
    result.save()


if __name__ == "__main__":
    main()
