"""The demo on a real pretrained model: `tinkertrace demo --model smollm2-135m-instruct`, timed, with its
held-out accuracy (sums training never asks) before and after training.

Needs the model (``make smollm2``). Runs the command as a user would (its own process, this checkout's
``.venv``), then records its wall time and the figures of its ``summary.json`` (steps, reward first →
last, held-out accuracy and mean reward before → after, rollouts sampled and trained). One result per
seed (``demo_smollm2--seed<N>`` for a seed other than the demo's default).

    .venv/bin/python benchmarks/demo_smollm2.py [--seed N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import record
from quickstart import add_demo_figures, run_logged

MEASURES = ("src/tinkertrace", "cli", "collector", "schemas")
MODEL = "smollm2-135m-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=None, help="the demo's --seed (default: the demo's)")
    parser.add_argument("--keep", type=Path, help="the demo's output folder, kept (default: a temp dir)")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args, variant="" if args.seed is None else f"seed{args.seed}")
    tinkertrace = Path(sys.executable).with_name("tinkertrace")
    with tempfile.TemporaryDirectory(prefix="tt-demo-smollm2-") as tmp:
        out = args.keep or Path(tmp) / "demo"
        command = [str(tinkertrace), "demo", "--model", MODEL, "--out", str(out)]
        command += [] if args.seed is None else ["--seed", str(args.seed)]
        wall, status = run_logged(command, record.ROOT, Path(tmp) / "demo.log")
        if status:
            raise SystemExit(f"{' '.join(command)} exited {status}")
        summary = json.loads((out / "summary.json").read_text())
    print(f"tinkertrace demo --model {MODEL}: {wall:,.0f} s")
    result.add("demo_s", wall, "s", f"`tinkertrace demo --model {MODEL}`, the whole command")
    add_demo_figures(result, summary)
    result.save()


if __name__ == "__main__":
    main()
