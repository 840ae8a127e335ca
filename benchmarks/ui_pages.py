"""How fast `tinkertrace ui` answers its list pages on a big run.

Generates N rollouts (default 100,000) synthetically into real span Parquet (``schemas.spans()``,
hive ``date=/hour=`` folders, as the collector writes): per rollout a root span, 1-3 LLM calls with
token ids and logprobs, and a reward. Then starts the real app (uvicorn, loopback) and times each
list page over HTTP: the first index of the files, then the median of several requests per page.

    .venv/bin/python benchmarks/ui_pages.py [--rollouts 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import record

from tinkertrace import schemas
from tinkertrace import semconv as sc
from tinkertrace.ui.server import UiServer

MEASURES = ("src/tinkertrace/ui", "src/tinkertrace/spanstore", "src/tinkertrace/builder")

T0 = 1_790_000_000_000_000_000  # ns
FILES = 40
SPAN_PREFIX = {"rollout": "a", "llm": "b", "reward": "c"}  # span ids unique within a trace


def _ids(n: int, prefix: str, offset: int = 0) -> np.ndarray:
    return np.char.add(prefix, np.char.zfill(np.arange(offset, offset + n).astype(str), 12))


def _lists(lengths: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[: offsets[-1]], type=kind))


def synthetic_spans(first: int, count: int, rng: np.random.Generator) -> pa.Table:
    """Spans of rollouts ``first .. first + count`` (root, 1-3 LLM calls, one reward each)."""
    rid = _ids(count, "r", first)
    task = np.char.add("task-", (np.arange(first, first + count) // 8).astype(str))
    calls = rng.integers(1, 4, count)
    reward = rng.random(count).round(3)
    start = T0 + np.arange(first, first + count, dtype=np.int64) * 50_000_000
    n_llm = int(calls.sum())
    llm_rollout = np.repeat(np.arange(count), calls)
    turn = np.arange(n_llm) - np.repeat(np.cumsum(calls) - calls, calls)
    prompt_len = 120 + 40 * turn
    response_len = rng.integers(10, 60, n_llm)

    def block(kind: str, idx: np.ndarray, **cols: object) -> dict[str, object]:
        n = len(idx)
        base = {
            "trace_id": np.char.zfill(rid[idx], 32),
            "span_id": np.char.add(SPAN_PREFIX[kind], np.char.zfill(np.arange(n).astype(str), 15)),
            "rollout_id": rid[idx],
            "task_id": task[idx],
            "span_type": np.full(n, kind),
        }
        base.update(cols)
        return base

    status = np.where(rng.random(count) < 0.03, sc.STATUS_FAILED, sc.STATUS_SUCCEEDED)
    root_attrs = [
        json.dumps({sc.ROLLOUT_STATUS: s, sc.ROLLOUT_LLM_CALLS: int(c), sc.ROLLOUT_REWARDS: 1,
                    sc.TASK_INPUT: json.dumps({"id": t, "question": f"question {t}"})})
        for s, c, t in zip(status, calls, task, strict=True)
    ]  # fmt: skip
    parts = [
        block(
            "rollout",
            np.arange(count),
            name=np.full(count, "rollout agent"),
            start_time=start,
            end_time=start + 40_000_000,
            attributes=np.array(root_attrs),
            split=np.full(count, "train"),
            attempt=np.zeros(count, np.int32),
        ),
        block(
            "llm",
            llm_rollout,
            name=np.full(n_llm, "chat model"),
            start_time=start[llm_rollout] + turn * 10_000_000 + 1_000_000,
            end_time=start[llm_rollout] + turn * 10_000_000 + 9_000_000,
            agent_name=np.full(n_llm, "solver"),
            model=np.full(n_llm, "tinkertrace/tiny-chat"),
            token_source=np.full(n_llm, "server"),
            policy_version=(llm_rollout + first) // 2000,
            prompt_token_ids=_lists(
                prompt_len, rng.integers(0, 256, int(prompt_len.sum()), np.int32), pa.int32()
            ),
            response_token_ids=_lists(
                response_len, rng.integers(0, 256, int(response_len.sum()), np.int32), pa.int32()
            ),
            response_logprobs=_lists(
                response_len, -rng.random(int(response_len.sum()), np.float32), pa.float32()
            ),
        ),
        block(
            "reward",
            np.arange(count),
            name=np.full(count, sc.REWARD_SPAN_NAME),
            start_time=start + 39_000_000,
            end_time=start + 39_000_000,
            reward_name=np.full(count, "primary"),
            reward_value=reward,
        ),
    ]
    schema = schemas.spans()
    tables = []
    for part in parts:
        n = len(part["trace_id"])  # type: ignore[arg-type]
        columns = {}
        for field in schema:
            value = part.get(field.name)
            if value is None:
                defaults = {"kind": "INTERNAL", "status_code": "UNSET", "attributes": "{}",
                            "resource_attributes": "{}", "events": "[]", "links": "[]"}  # fmt: skip
                value = (
                    np.full(n, defaults[field.name]) if field.name in defaults else pa.nulls(n, field.type)
                )
            if field.name == "received_at":
                value = part["end_time"]
            columns[field.name] = value if isinstance(value, pa.Array) else pa.array(value, type=field.type)
        tables.append(pa.table(columns, schema=schema))
    return pa.concat_tables(tables)


def write_run(root: Path, rollouts: int) -> int:
    """The spans of ``rollouts`` rollouts in ``FILES`` files under ``root/spans``; returns the span count."""
    rng = np.random.default_rng(0)
    per_file = -(-rollouts // FILES)
    spans = 0
    for i, first in enumerate(range(0, rollouts, per_file)):
        table = synthetic_spans(first, min(per_file, rollouts - first), rng)
        folder = root / "spans" / "date=2026-09-21" / f"hour={i % 24:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / f"bench-{i:04d}.parquet", compression="zstd", row_group_size=8192)
        spans += table.num_rows
    return spans


PAGES = {
    "run page /": "/",
    "rollouts, newest first": "/rollouts",
    "rollouts sorted by reward": "/rollouts?sort=reward&order=desc",
    "rollouts sorted by tokens, page 1000": "/rollouts?sort=tokens&order=asc&page=1000&per_page=50",
    "rollouts filtered: failed": "/rollouts?status=failed",
    "rollouts text search": "/rollouts?q=task-4321",
    "rollouts filtered: training outcome": "/rollouts?outcome=not_trained",
    "rollouts filtered: policy version": "/rollouts?version=2&sort=reward",
    "rollouts task filter + sort by turns": "/rollouts?task=task-777&sort=turns",
    "JSON /api/rollouts, 200 rows": "/api/rollouts?per_page=200&sort=duration_s",
    "live poll /api/status": "/api/status",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--refresh-seconds", type=float, default=0.0,
        help="the app's file re-check interval (0: every request looks for new files, the worst case)",
    )  # fmt: skip
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    with tempfile.TemporaryDirectory(prefix="tinkertrace-ui-bench-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        spans = write_run(root, args.rollouts)
        elapsed = time.perf_counter() - started
        print(f"wrote {args.rollouts:,} rollouts ({spans:,} spans, {FILES} files) in {elapsed:.1f} s")
        started = time.perf_counter()
        server = UiServer([root], refresh_s=args.refresh_seconds).start()
        print(f"first index (all files read once): {time.perf_counter() - started:.2f} s")
        result.add(
            "first_index_s", time.perf_counter() - started, "s", f"{args.rollouts:,} rollouts: first index"
        )
        try:
            base = f"http://127.0.0.1:{server.port}"
            print(f"file re-check every {args.refresh_seconds} s")
            with httpx.Client(base_url=base, timeout=60) as client:
                print(f"{'page':<40} {'median ms':>10} {'max ms':>8}  rows")
                for label, path in PAGES.items():
                    times = []
                    for _ in range(args.repeat):
                        t = time.perf_counter()
                        response = client.get(path)
                        times.append((time.perf_counter() - t) * 1000)
                        response.raise_for_status()
                    rows = (
                        response.text.count("<tr data-rollout=") if "api" not in path else response.text[:60]
                    )
                    print(f"{label:<40} {statistics.median(times):>10.1f} {max(times):>8.1f}  {rows}")
                    what = f"{label}, {args.rollouts:,} rollouts: median of {args.repeat}"
                    result.add(f"{record.slug(label)}_ms", statistics.median(times), "ms", what)
                rid = client.get("/api/rollouts?sort=turns&per_page=25").json()["rows"][0]["rollout_id"]
                print("one rollout (not a list page: its task group is built from its span files)")
                for label, path in (("rollout page, first view", f"/rollouts/{rid}"),
                                    ("rollout page, again (cached build)", f"/rollouts/{rid}"),
                                    ("trajectory page", f"/trajectory/{rid}")):  # fmt: skip
                    t = time.perf_counter()
                    client.get(path).raise_for_status()
                    print(f"{label:<40} {(time.perf_counter() - t) * 1000:>10.1f}")
                    result.add(f"{record.slug(label)}_ms", (time.perf_counter() - t) * 1000, "ms", label)
        finally:
            server.stop()
    print(f"load average: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    result.save()


if __name__ == "__main__":
    main()
