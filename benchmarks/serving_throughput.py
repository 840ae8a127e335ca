"""Sampling endpoint throughput: completions/s and tokens/s with N concurrent clients.

Runs the endpoint in this process over the local engine (built-in model, CPU) and fires chat
requests from N concurrent AsyncOpenAI clients. Two workloads:

* ``distinct``: every request has its own prompt (no two requests can share a sample call);
* ``group``: all clients send the same prompt, as a GRPO group's first turn does, with request
  coalescing off (``window 0``) and on (``window 5 ms``: identical requests share one call).

    .venv/bin/python benchmarks/serving_throughput.py --clients 1 4 8 --requests 8 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

import openai
import record
import torch
from rich.console import Console
from rich.table import Table

from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder

MEASURES = ("src/tinkertrace/serving", "src/tinkertrace/engine", "src/tinkertrace/models")


@dataclass
class Result:
    workload: str
    window_ms: float
    clients: int
    completions: int
    tokens: int
    seconds: float
    sample_calls: int


async def _drive(
    url: str, model: str, clients: int, requests: int, max_tokens: int, same: bool
) -> tuple[int, int]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

    async def one_client(c: int) -> int:
        tokens = 0
        for r in range(requests):
            text = "Tell me a story." if same else f"Client {c} asks question {r}."
            resp = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens
            )
            tokens += len(resp.choices[0].model_extra["token_ids"])
        return tokens

    counts = await asyncio.gather(*(one_client(c) for c in range(clients)))
    await client.close()
    return clients * requests, sum(counts)


def run(workload: str, window_ms: float, clients: int, requests: int, max_tokens: int, model: str) -> Result:
    service = ServiceClient(device="cpu")
    sampler = service.create_sampling_client(base_model=model).result()
    policy = PolicyHolder(sampler, load_tokenizer(BUILTIN_MODEL), model)
    app = create_app(policy, batch_window_s=window_ms / 1000)
    with BackgroundServer(app) as server:
        asyncio.run(_drive(server.url, model, 1, 1, max_tokens, True))  # warm-up
        calls_before = app.state.endpoint.generator.batcher.calls
        start = time.perf_counter()
        completions, tokens = asyncio.run(
            _drive(server.url, model, clients, requests, max_tokens, same=workload == "group")
        )
        seconds = time.perf_counter() - start
        calls = app.state.endpoint.generator.batcher.calls - calls_before
    return Result(workload, window_ms, clients, completions, tokens, seconds, calls)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8], help="concurrent clients to try")
    parser.add_argument("--requests", type=int, default=6, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request")
    parser.add_argument(
        "--model", default=BUILTIN_MODEL, help="built-in model name (e.g. tinkertrace/tiny-chat:base)"
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (1 keeps CPU sampling steady when the cores are shared)",
    )
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    torch.set_num_threads(args.torch_threads)

    title = f"sampling endpoint, local engine ({args.model}, CPU, {args.torch_threads} torch threads)"
    table = Table(title=f"{title}, max_tokens={args.max_tokens}")
    for col in (
        "workload",
        "window",
        "clients",
        "completions",
        "tokens",
        "s",
        "completions/s",
        "tokens/s",
        "calls",
    ):
        table.add_column(col, justify="right")
    for clients in args.clients:
        for workload, window in (("distinct", 5.0), ("group", 0.0), ("group", 5.0)):
            r = run(workload, window, clients, args.requests, args.max_tokens, args.model)
            table.add_row(
                r.workload,
                f"{r.window_ms:g} ms",
                str(r.clients),
                str(r.completions),
                str(r.tokens),
                f"{r.seconds:.2f}",
                f"{r.completions / r.seconds:.1f}",
                f"{r.tokens / r.seconds:.0f}",
                str(r.sample_calls),
            )
            key = f"{workload}_{window:g}ms_{clients}_clients".replace(".", "_")
            what = f"{workload} prompts, coalescing window {window:g} ms, {clients} clients"
            result.add(f"{key}_tok_s", r.tokens / r.seconds, "tokens/s", what)
    Console(width=140).print(table)
    result.save()


if __name__ == "__main__":
    main()
