"""Follow mode's incremental build: does a poll's cost follow the new data, or the folder's size?

Replays a real spans folder (e.g. a ``tinkertrace demo`` output's ``spans/``) into an empty one, file
by file in the order they were written, and polls a :class:`~tinkertrace.online.tail.SpanTail`
after each file, as ``train --follow`` does. Prints the poll time's p50/p95 and the mean of the
first and the last ``--edge`` polls: equal when a poll binds only its files, rising with the run
when it binds the whole folder (as it did before 0.1.x: 0.5 s → 1.3–2.5 s over a 60-step demo's 170
files on the 2-core VM).

    .venv/bin/tinkertrace demo --out /tmp/demo
    .venv/bin/python benchmarks/tail_poll.py /tmp/demo/spans
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import record

from tinkertrace.online.tail import SpanTail
from tinkertrace.spanstore.reader import list_span_files

MEASURES = ("src/tinkertrace/online", "src/tinkertrace/builder", "src/tinkertrace/spanstore")


def replay(spans: Path, into: Path) -> tuple[list[float], int]:
    """Poll seconds after each file of ``spans`` lands in ``into``, and the rollouts built."""
    tail = SpanTail(into)
    seconds, built = [], 0
    for path in sorted(list_span_files(spans), key=os.path.getmtime):
        target = into / path.relative_to(spans)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
        started = time.perf_counter()
        built += tail.poll().rollouts_built
        seconds.append(time.perf_counter() - started)
    return seconds, built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spans", type=Path, help="a spans folder to replay (a demo's spans/)")
    parser.add_argument("--edge", type=int, default=20, help="polls averaged at the start and at the end")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    if not list_span_files(args.spans):
        parser.error(f"no span files under {args.spans}")
    with tempfile.TemporaryDirectory() as into:
        seconds, built = replay(args.spans, Path(into))
    p50, p95 = np.percentile(seconds, [50, 95])
    first, last = np.mean(seconds[: args.edge]), np.mean(seconds[-args.edge :])
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(
        f"{len(seconds)} polls, {built} rollouts built  ·  poll p50 {p50:.3f}s p95 {p95:.3f}s  ·  "
        f"first {args.edge} {first:.3f}s, last {args.edge} {last:.3f}s"
    )
    result.add("polls", len(seconds), "polls", f"one per span file of {args.spans}")
    result.add("poll_p50_s", p50, "s", "poll time, median")
    result.add("poll_p95_s", p95, "s", "poll time, p95")
    result.add("first_polls_s", first, "s", f"mean of the first {args.edge} polls")
    result.add("last_polls_s", last, "s", f"mean of the last {args.edge} polls")
    result.save()


if __name__ == "__main__":
    main()
