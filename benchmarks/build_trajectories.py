"""Benchmark `build-trajectories`: generate span Parquet (vectorised), time the build, print
spans/s and peak memory.

    .venv/bin/python benchmarks/build_trajectories.py [--rollouts 100000] [--turns 4] [--keep DIR]
        [--memory-limit 512MB] [--buckets K]

Each rollout has a root span, an agent span, ``turns`` LLM calls and as many rewards
(2 + 2 * turns spans; 100,000 rollouts x 4 turns = 1,000,000 spans). Turn k's prompt is the
previous prompt + response + 10 new tokens, starting at 150 tokens; responses have 50 tokens, so
every rollout merges into one trajectory. The build runs in a child process so its peak RSS is
measured alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import record

from tinkertrace import schemas
from tinkertrace import semconv as sc

MEASURES = ("src/tinkertrace/builder", "src/tinkertrace/spanstore", "schemas")

T0 = 1_767_225_600_000_000_000
PROMPT0, RESPONSE, USER = 150, 50, 10


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


def _hex(values: np.ndarray, width: int) -> pa.Array:
    return pa.array(np.char.mod(f"%0{width}x", values).astype(object), pa.string())


def make_chunk(first: int, n: int, turns: int, rng: np.random.Generator) -> pa.Table:
    """Spans of rollouts ``first .. first + n - 1``, sorted by rollout id then start time."""
    per = 2 + 2 * turns
    rollout = np.repeat(np.arange(first, first + n), per)
    slot = np.tile(np.arange(per), n)  # 0 root, 1 agent, then (llm, reward) pairs
    kind = np.where(slot == 0, 0, np.where(slot == 1, 1, np.where((slot - 2) % 2 == 0, 2, 3)))
    turn = np.where(slot >= 2, (slot - 2) // 2, -1)
    is_llm, is_reward = kind == 2, kind == 3
    n_llm = int(is_llm.sum())
    span = _hex(rollout * 64 + slot + 1, 16)
    parent = np.where(slot == 0, -1, np.where(slot == 1, rollout * 64 + 1, rollout * 64 + 2))
    parent_ids = pa.array(
        np.where(parent < 0, None, np.char.mod("%016x", np.maximum(parent, 0)).astype(object)), pa.string()
    )
    base = T0 + rollout.astype(np.int64) * 10_000_000
    start = base + np.where(slot < 2, slot * 1000, 2000 + turn * 4_000_000 + (kind == 3) * 3_000_000)
    end = np.where(slot == 0, base + 20_000_000, np.where(slot == 1, base + 19_000_000, start + 2_000_000))
    end = np.where(is_reward, start, end)

    # token ids: every list is a slice of one random pool per rollout
    pool_len = PROMPT0 + turns * (RESPONSE + USER)
    pool = rng.integers(0, 50_000, (n, pool_len), dtype=np.int32).ravel()
    k = turn[is_llm]
    r0 = (rollout[is_llm] - first).astype(np.int64) * pool_len
    p_len = PROMPT0 + k * (RESPONSE + USER)
    prompt = pa.ListArray.from_arrays(
        pa.array(np.r_[0, np.cumsum(p_len)].astype(np.int32)), pa.array(pool[_ranges(r0, p_len)])
    )
    r_len = np.full(n_llm, RESPONSE)
    response = pa.ListArray.from_arrays(
        pa.array(np.r_[0, np.cumsum(r_len)].astype(np.int32)), pa.array(pool[_ranges(r0 + p_len, r_len)])
    )
    logprobs = pa.ListArray.from_arrays(
        pa.array(np.r_[0, np.cumsum(r_len)].astype(np.int32)),
        pa.array(-rng.random(int(r_len.sum()), dtype=np.float32)),
    )
    llm_idx = np.flatnonzero(is_llm)

    def scatter(values: pa.Array) -> pa.Array:
        """A column with ``values`` on LLM rows and null elsewhere."""
        positions = np.full(len(slot), n_llm, dtype=np.int64)
        positions[llm_idx] = np.arange(n_llm)
        return pa.concat_arrays([values, pa.nulls(1, values.type)]).take(pa.array(positions))

    span_type = np.array([sc.TYPE_ROLLOUT, sc.TYPE_AGENT, sc.TYPE_LLM, sc.TYPE_REWARD], dtype=object)[kind]
    root_attrs = json.dumps({sc.ROLLOUT_LLM_CALLS: turns, sc.ROLLOUT_REWARDS: turns})
    attrs = np.array([root_attrs, "{}", '{"gen_ai.operation.name":"chat"}', "{}"], dtype=object)[kind]
    rollout_ids = _hex(rollout, 12)
    cols = {
        "trace_id": _hex(rollout, 32),
        "span_id": span,
        "parent_span_id": parent_ids,
        "name": pa.array(np.array(["rollout", "invoke_agent solver", "chat m", "reward"], object)[kind]),
        "kind": pa.array(np.full(len(slot), "INTERNAL", dtype=object)),
        "start_time": pa.array(start, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
        "end_time": pa.array(end, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
        "status_code": pa.array(np.full(len(slot), "UNSET", dtype=object)),
        "span_type": pa.array(span_type),
        "rollout_id": rollout_ids,
        "task_id": _hex(rollout // 8, 8),
        "attempt": pa.array(np.zeros(len(slot), np.int32)),
        "split": pa.array(np.full(len(slot), "train", dtype=object)),
        "agent_name": pa.array(np.where(slot == 0, None, "solver").astype(object), pa.string()),
        "model": pa.array(np.where(is_llm, "m", None).astype(object), pa.string()),
        "response_id": pa.array(
            np.where(is_llm, np.char.mod("resp-%d", rollout * 64 + slot).astype(object), None), pa.string()
        ),
        "reward_name": pa.array(np.where(is_reward, "primary", None).astype(object), pa.string()),
        "reward_value": pa.array(np.where(is_reward, rng.random(len(slot)), np.nan), from_pandas=True),
        "prompt_token_ids": scatter(prompt),
        "response_token_ids": scatter(response),
        "response_logprobs": scatter(logprobs),
        "token_source": pa.array(np.where(is_llm, "server", None).astype(object), pa.string()),
        "policy_version": pa.array(np.where(is_llm, 3, 0), pa.int64()),
        "attributes": pa.array(attrs),
        "resource_attributes": pa.array(np.full(len(slot), '{"service.name":"bench"}', dtype=object)),
        "events": pa.array(np.full(len(slot), "[]", dtype=object)),
        "links": pa.array(np.full(len(slot), "[]", dtype=object)),
        "received_at": pa.array(end + 1, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
    }
    schema = schemas.spans()
    arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(len(slot), f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def generate(root: Path, rollouts: int, turns: int, files: int) -> tuple[int, int]:
    """Write the spans as ``files`` Parquet files; returns (spans, bytes on disk)."""
    rng = np.random.default_rng(0)
    per_file = -(-rollouts // files)
    spans = size = 0
    for i, first in enumerate(range(0, rollouts, per_file)):
        table = make_chunk(first, min(per_file, rollouts - first), turns, rng)
        path = root / "date=2026-01-01" / f"hour={i % 24:02d}" / f"part-{i:04d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="zstd", row_group_size=65536)
        spans += table.num_rows
        size += path.stat().st_size
    return spans, size


BUILD = """
import sys, time, json
from pathlib import Path
from tinkertrace.builder import BuildSettings, build_trajectories
t = time.perf_counter()
buckets = int(sys.argv[4]) or None
options = BuildSettings(memory_limit=sys.argv[3], buckets=buckets)
r = build_trajectories(Path(sys.argv[1]), Path(sys.argv[2]), options)
s = r.summary
print(json.dumps({"seconds": time.perf_counter() - t, "spans": s.spans, "triplets": s.triplets,
                  "trajectories": s.trajectories, "rewards_matched": s.rewards_matched,
                  "buckets": s.buckets}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--memory-limit", default="512MB", help="DuckDB memory limit for the build")
    parser.add_argument("--buckets", type=int, default=0, help="token buckets (default: automatic)")
    parser.add_argument("--keep", type=Path, help="generate into (and keep, and reuse) this folder")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    with tempfile.TemporaryDirectory(prefix="tt-bench-build-") as tmp:
        root = args.keep or Path(tmp)
        spans_dir, out = root / "spans", root / "out"
        t = time.perf_counter()
        if args.keep and spans_dir.is_dir():
            size = sum(p.stat().st_size for p in spans_dir.rglob("*.parquet"))
            print(f"reusing {spans_dir} ({size / 2**20:,.0f} MiB Parquet)")
        else:
            n_spans, size = generate(spans_dir, args.rollouts, args.turns, args.files)
            took = time.perf_counter() - t
            print(f"generated {n_spans:,} spans, {size / 2**20:,.0f} MiB Parquet in {took:.1f} s")
        shutil.rmtree(out, ignore_errors=True)
        load_before = os.getloadavg()[0]
        run = subprocess.run(
            [sys.executable, "-c", BUILD, str(spans_dir), str(out), args.memory_limit, str(args.buckets)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        stats = json.loads(run.stdout.strip().splitlines()[-1])
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak = usage.ru_maxrss / 1024  # KiB -> MiB
        cpu = usage.ru_utime + usage.ru_stime
        out_size = sum(p.stat().st_size for p in out.glob("*.parquet"))
        print(
            f"build-trajectories: {stats['spans']:,} spans in {stats['seconds']:.1f} s = "
            f"{stats['spans'] / stats['seconds']:,.0f} spans/s; {stats['triplets']:,} triplets, "
            f"{stats['trajectories']:,} trajectories, {stats['rewards_matched']:,} rewards matched"
        )
        print(
            f"memory limit {args.memory_limit}, {stats['buckets']} token buckets; load average "
            f"(1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores"
        )
        print(f"CPU time of the build (all threads): {cpu:.1f} s")
        print(f"peak RSS of the build: {peak:,.0f} MiB (input {size / 2**20:,.0f} MiB Parquet, "
              f"output {out_size / 2**20:,.0f} MiB)")  # fmt: skip
    result.add("spans", stats["spans"], "spans", "spans built")
    result.add("build_s", stats["seconds"], "s", "wall time of build-trajectories")
    result.add("spans_per_s", stats["spans"] / stats["seconds"], "spans/s", "build throughput (wall)")
    result.add("trajectories", stats["trajectories"], "trajectories", "trajectories built")
    result.add("build_cpu_s", cpu, "s", "CPU time of the build, all threads")
    result.add("peak_rss_mib", peak, "MiB", f"peak RSS of the build at memory limit {args.memory_limit}")
    result.add("input_mib", size / 2**20, "MiB", "input span Parquet")
    result.save()


if __name__ == "__main__":
    main()
