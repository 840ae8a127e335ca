"""An agent worker for the distributed form of hello: rounds of rollouts against a model endpoint,
spans to a collector, until stopped (Ctrl-C) or ``--rounds``. Start as many as you like::

    python examples/hello/worker.py --base-url http://127.0.0.1:8000/v1 --collector http://127.0.0.1:4318
"""

from __future__ import annotations

import argparse
import sys
from itertools import count
from pathlib import Path

import tinkertrace
from tinkertrace.evaluation.rollouts import load_ref, run_rollouts

AGENT = Path(__file__).resolve().with_name("agent.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--model", default="tinkertrace/tiny-chat", help="model name sent to the endpoint")
    parser.add_argument("--collector", default=None, help="OTLP/HTTP collector URL (default: ./spans)")
    parser.add_argument("--rounds", type=int, default=0, help="passes over the questions (0: until stopped)")
    parser.add_argument("--samples", type=int, default=4, help="rollouts per question and round (a group)")
    args = parser.parse_args()
    tinkertrace.init(endpoint=args.collector) if args.collector else tinkertrace.init(spans_dir="spans")
    agent = load_ref(f"{AGENT}:introduce")
    tasks = load_ref(f"{AGENT}:load_tasks")("train")
    try:
        for round_ in count():
            if args.rounds and round_ >= args.rounds:
                break
            results = run_rollouts(
                agent,
                tasks,
                samples_per_task=args.samples,
                agent_kwargs={"base_url": args.base_url, "model": args.model},
            )
            rewards = [r.reward for r in results if r.reward is not None]
            mean = sum(rewards) / max(len(rewards), 1)
            print(f"round {round_}: {len(results)} rollouts, mean reward {mean:.3f}", flush=True)
    except KeyboardInterrupt:
        pass
    if not tinkertrace.flush():
        sys.exit("some spans could not be delivered yet (kept in the spool)")


if __name__ == "__main__":
    main()
