"""In-process cost of the collector's hot path per span, in CPU µs (not wall time: the machine may be shared).

Stages for one realistic 512-span OTLP request (packed token ids and logprobs): conversion of the
protobuf bytes to Arrow (``body_to_table``, the collector's path: the compiled scan; and, for
comparison, ``reference.convert``, the Python decoder used for shapes the scan declines),
WAL append + fdatasync, and the Parquet stage (sort by rollout + zstd write of a
file of ``--requests`` such requests). Best and median of ``--repeat`` runs.

    .venv/bin/python benchmarks/collector_convert.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import record

from tinkertrace.collector.wal import WriteAheadLog
from tinkertrace.spanstore.convert import body_to_table, reference
from tinkertrace.spanstore.samples import llm_request
from tinkertrace.spanstore.writer import write_parquet_atomic

MEASURES = ("collector", "src/tinkertrace/spanstore", "schemas")

T0 = 1_767_225_600_000_000_000


def cpu_us_per_span(work: Callable[[], object], spans: int, repeat: int) -> tuple[float, float]:
    """(best, median) of ``repeat`` runs: process CPU time of ``work()`` per span, in µs.

    On a shared VM the two differ by up to 2x; the median is what a long-running collector sees."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        work()
        times.append((time.process_time() - start) / spans * 1e6)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spans", type=int, default=512, help="spans per request")
    parser.add_argument(
        "--requests", type=int, default=20, help="requests per Parquet file in the write stage"
    )
    parser.add_argument(
        "--spread", type=float, default=0.5, help="each span's token counts vary by up to this fraction"
    )
    parser.add_argument("--repeat", type=int, default=7, help="runs per stage; best and median are reported")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    requests = [llm_request(args.spans, seed=s, spread=args.spread) for s in range(args.requests)]
    bodies = [r.SerializeToString() for r in requests]
    n = args.spans
    print(
        f"{n} spans/request, 300 prompt + 100 response token ids + 100 logprobs per span "
        f"(±{args.spread:.0%}, packed); "
        f"{len(bodies[0]) / n:,.0f} OTLP bytes/span"
    )
    body_to_table(bodies[0], T0)  # warm the attribute cache, as a running collector has it
    stages = {
        "parse + convert (body_to_table)": cpu_us_per_span(
            lambda: body_to_table(bodies[1], T0), n, args.repeat
        ),
        "reference decoder (reference.convert)": cpu_us_per_span(
            lambda: reference.convert(bodies[1], T0), n, args.repeat
        ),
    }
    with tempfile.TemporaryDirectory() as tmp:
        wal = WriteAheadLog(Path(tmp) / "wal")
        wal.open_segment()

        def log_all() -> None:
            for body in bodies:
                wal.append(body, T0)
            wal.sync()

        stages["WAL append + fdatasync (per file batch)"] = cpu_us_per_span(
            log_all, n * len(bodies), args.repeat
        )
        wal.close_segment()
        table = pa.concat_tables([body_to_table(b, T0).table for b in bodies])
        out = Path(tmp) / "x.parquet"
        stages["Parquet: sort + zstd write + fsync"] = cpu_us_per_span(
            lambda: write_parquet_atomic(table, out, splice_lists=True), table.num_rows, args.repeat
        )
        stages["Parquet, plain pyarrow (sink, compact)"] = cpu_us_per_span(
            lambda: write_parquet_atomic(table, out), table.num_rows, args.repeat
        )
        size = out.stat().st_size / table.num_rows
    pipeline = ("parse + convert (body_to_table)", "WAL append + fdatasync (per file batch)")
    pipeline += ("Parquet: sort + zstd write + fsync",)
    print(f"  {'stage':<45} {'best':>6} {'median':>7} CPU µs/span")
    for name, (best, median) in stages.items():
        print(f"  {name:<45} {best:6.1f} {median:7.1f}")
    print(f"  Parquet size {size:,.0f} bytes/span")
    for label, index in (("best", 0), ("median", 1)):
        total = sum(stages[name][index] for name in pipeline)
        print(
            f"  collector pipeline without HTTP ({label}): {total:.1f} µs/span = "
            f"{1e6 / total:,.0f} spans per CPU-second"
        )
    keys = ("convert_us", "reference_us", "wal_us", "parquet_us", "parquet_plain_us")
    for key, (name, (_, median)) in zip(keys, stages.items(), strict=True):
        result.add(key, median, "CPU µs/span", f"{name}, median of {args.repeat}")
    result.add("parquet_bytes_per_span", size, "bytes/span", "Parquet size")
    total = sum(stages[name][1] for name in pipeline)
    result.add("pipeline_spans_per_cpu_s", 1e6 / total, "spans/CPU-s", "collector pipeline, no HTTP (median)")
    result.save()


if __name__ == "__main__":
    main()
