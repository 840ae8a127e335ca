"""Throughput of the training data path: prepare (clean, group, advantages) and Datum building.

Prints rows/s and tokens/s for a synthetic trajectories table (no model involved), so the data
math can be compared with the engine's forward+backward throughput (benchmarks/engine_*.py).

    .venv/bin/python benchmarks/train_datums.py --rows 20000 --tokens 512
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa
import record

from tinkertrace import schemas
from tinkertrace.training.dataset import REQUIRED_COLUMNS, prepare
from tinkertrace.training.datums import build_datums

MEASURES = ("src/tinkertrace/training",)


def synthetic(rows: int, tokens: int, per_group: int, seed: int = 0) -> pa.Table:
    """``rows`` trajectories of ``tokens`` tokens (first half prompt), ``per_group`` per task."""
    rng = np.random.default_rng(seed)
    lengths = np.full(rows, tokens, dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    flat_tokens = rng.integers(0, 256, offsets[-1], dtype=np.int32)
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    mask = (position >= tokens // 2).astype(np.int8)
    logprobs = np.where(mask > 0, -rng.random(offsets[-1]), 0).astype(np.float32)
    ids = np.array([f"r{i}" for i in range(rows)])
    return pa.table(
        {
            "rollout_id": ids,
            "task_id": np.array([f"t{i // per_group}" for i in range(rows)]),
            "agent_name": np.full(rows, "solver"),
            "segment": np.zeros(rows, np.int32),
            "tokens": pa.ListArray.from_arrays(offsets, flat_tokens),
            "logprobs": pa.ListArray.from_arrays(offsets, logprobs),
            "action_mask": pa.ListArray.from_arrays(offsets, mask),
            "reward": rng.integers(0, 2, rows).astype(np.float64),
        }
    ).cast(pa.schema([schemas.trajectories().field(n) for n in REQUIRED_COLUMNS]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20000, help="trajectory rows")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per row")
    parser.add_argument("--per-group", type=int, default=8, help="rollouts per task")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    table = synthetic(args.rows, args.tokens, args.per_group)
    n_tokens = args.rows * args.tokens

    start = time.perf_counter()
    data = prepare(table)
    prepared = time.perf_counter() - start
    start = time.perf_counter()
    batch = build_datums(
        data.table["tokens"], data.table["logprobs"], data.table["action_mask"], data.advantage_of_row
    )
    built = time.perf_counter() - start
    rows = len(batch.data)
    removed = data.report.groups_constant_removed
    print(
        f"rows {args.rows}, tokens/row {args.tokens}, groups {data.num_groups} ({removed} constant removed)"
    )
    for name, seconds, n_rows, tokens in (
        ("prepare", prepared, args.rows, n_tokens),
        ("build_datums", built, rows, batch.num_tokens),
    ):
        print(
            f"{name:13s} {seconds:7.3f} s {n_rows / seconds:12,.0f} rows/s {tokens / seconds:14,.0f} tokens/s"
        )
        result.add(f"{name}_rows_per_s", n_rows / seconds, "rows/s", f"{name}, {args.tokens} tokens/row")
        result.add(f"{name}_tokens_per_s", tokens / seconds, "tokens/s", f"{name}, {args.rows} rows")
    result.save()


if __name__ == "__main__":
    main()
