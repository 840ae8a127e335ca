"""Agent-lightning's span form through the collector's conversion, then ``build-trajectories`` on it.

Agent-lightning's LLM spans (``openai.chat.completion``, no tinkertrace span type, rollout id as a
resource attribute) carry token ids as plain int lists under its own keys (``prompt_token_ids``,
``response_token_ids``). The collector lifts them into the token list columns (``schemas.columns``'
``TOKEN_ALIASES``) on its compiled path. This script converts such requests (prints the conversion's
CPU µs/span), writes ``--spans`` of them to Parquet as the collector would, and runs
``tinkertrace build-trajectories`` over them at ``--memory-limit`` in a subprocess, printing its wall
time and peak RSS. ``--as-json`` stores the token lists in the JSON attributes instead (where they
went before the collector lifted them), for comparison.

    .venv/bin/python benchmarks/collector_foreign_spans.py --spans 120000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import record

from tinkertrace import semconv
from tinkertrace.spanstore.convert import body_to_table, warm_up_kernels
from tinkertrace.spanstore.samples import llm_request
from tinkertrace.spanstore.writer import PartitionedParquetWriter

MEASURES = ("collector", "src/tinkertrace/spanstore", "src/tinkertrace/builder", "schemas")

CALLS_PER_ROLLOUT = 8


def agentlightning_request(spans: int, seed: int) -> bytes:
    """A request of Agent-lightning-style LLM spans: its token keys as int lists, no span type."""
    request = llm_request(spans, prompt_tokens=300, response_tokens=100, spread=0.5, packed=False, seed=seed)
    renames = {
        semconv.PROMPT_TOKEN_IDS: semconv.AGL_PROMPT_TOKEN_IDS,
        semconv.RESPONSE_TOKEN_IDS: semconv.AGL_RESPONSE_TOKEN_IDS,
    }
    dropped = {semconv.SPAN_TYPE, semconv.ROLLOUT_ID, semconv.TASK_ID, semconv.RESPONSE_LOGPROBS}
    for span in request.resource_spans[0].scope_spans[0].spans:
        span.name = "openai.chat.completion"
        kept = [kv for kv in span.attributes if kv.key not in dropped]
        del span.attributes[:]
        span.attributes.extend(kept)
        for kv in span.attributes:
            kv.key = renames.get(kv.key, kv.key)
    return request.SerializeToString()


def as_rollouts(table: pa.Table, first_rollout: int, as_json: bool) -> pa.Table:
    """Give each CALLS_PER_ROLLOUT rows a trace and an Agent-lightning rollout id (resource attribute);
    ``as_json`` moves the token ids into the JSON attributes."""
    n = table.num_rows
    rollout = first_rollout + np.arange(n) // CALLS_PER_ROLLOUT
    names = [f"ro-{r}" for r in rollout]
    resources = [json.dumps({semconv.AGL_ROLLOUT_ID: name, semconv.AGL_ATTEMPT_ID: "1"}) for name in names]
    table = table.set_column(
        table.schema.get_field_index("trace_id"), "trace_id", pa.array([f"{r:032x}" for r in rollout])
    )
    table = table.set_column(
        table.schema.get_field_index("resource_attributes"), "resource_attributes", pa.array(resources)
    )
    if as_json:
        prompts, responses = table.column("prompt_token_ids"), table.column("response_token_ids")
        attributes = [
            json.dumps({**json.loads(a), "prompt_token_ids": p, "response_token_ids": r})
            for a, p, r in zip(
                table.column("attributes").to_pylist(),
                prompts.to_pylist(),
                responses.to_pylist(),
                strict=True,
            )
        ]
        table = table.set_column(
            table.schema.get_field_index("attributes"), "attributes", pa.array(attributes)
        )
        for column in ("prompt_token_ids", "response_token_ids"):
            index = table.schema.get_field_index(column)
            table = table.set_column(index, column, pa.nulls(n, table.schema.field(column).type))
    return table.set_column(
        table.schema.get_field_index("span_id"),
        "span_id",
        pc.binary_join_element_wise(table.column("span_id"), pa.array([f"{i:08x}" for i in range(n)]), ""),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spans", type=int, default=120_000)
    parser.add_argument("--memory-limit", default="512MB")
    parser.add_argument("--as-json", action="store_true", help="token ids in the JSON attributes (before)")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args, variant="as-json" if args.as_json else "")
    bodies = [agentlightning_request(512, seed) for seed in range(4)]
    warm_up_kernels()
    started = time.process_time()
    tables = [body_to_table(body, time.time_ns()).table for body in bodies]
    cpu = time.process_time() - started
    print(f"conversion: {cpu / (512 * len(bodies)) * 1e6:.1f} µs/span (Agent-lightning form, in-process)")
    assert tables[0].column("prompt_token_ids").null_count == 0, "token ids were not lifted"
    with tempfile.TemporaryDirectory() as tmp:
        spans_dir, out = Path(tmp) / "spans", Path(tmp) / "out"
        with PartitionedParquetWriter(spans_dir) as writer:
            written = 0
            while written < args.spans:
                table = tables[(written // 512) % len(tables)].slice(0, min(512, args.spans - written))
                writer.write(as_rollouts(table, written // CALLS_PER_ROLLOUT, args.as_json))
                written += table.num_rows
        command = [sys.executable, "-m", "tinkertrace.cli.main", "build-trajectories", str(spans_dir)]
        command += ["-o", str(out), "--memory-limit", args.memory_limit]
        started = time.perf_counter()
        build = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        form = "JSON attributes" if args.as_json else "token columns"
        print(
            f"build-trajectories over {written:,} Agent-lightning LLM spans ({form}) at --memory-limit "
            f"{args.memory_limit}: exit {build.returncode}, {wall:.1f}s, peak RSS {peak:.0f} MB"
        )
        if build.returncode:
            print(build.stdout[-2000:], build.stderr[-2000:])
            return
    result.add(
        "convert_us", cpu / (512 * len(bodies)) * 1e6, "CPU µs/span", "conversion, Agent-lightning form"
    )
    result.add("spans", written, "spans", f"Agent-lightning LLM spans ({form})")
    result.add("build_s", wall, "s", f"build-trajectories wall time at --memory-limit {args.memory_limit}")
    result.add("build_peak_rss_mb", peak, "MB", "peak RSS of build-trajectories")
    result.save()


if __name__ == "__main__":
    main()
