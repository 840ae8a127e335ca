"""An agent worker for the distributed form of hello: rollouts against a model endpoint, spans to a
collector. Start as many as you like::

    python examples/hello/worker.py --base-url http://127.0.0.1:8000/v1 --collector http://127.0.0.1:4318
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tinkertrace
from tinkertrace.evaluation import load_ref, run_rollouts

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--model", default="tinkertrace/tiny-chat", help="model name sent to the endpoint")
    parser.add_argument("--collector", default=None, help="OTLP/HTTP collector URL (default: ./spans)")
    parser.add_argument("--rounds", type=int, default=4, help="passes over the training questions")
    parser.add_argument("--samples", type=int, default=4, help="rollouts per question and round")
    args = parser.parse_args()
    tinkertrace.init(endpoint=args.collector) if args.collector else tinkertrace.init(spans_dir="spans")
    agent = load_ref(f"{HERE / 'agent.py'}:introduce")
    tasks = load_ref(f"{HERE / 'agent.py'}:load_tasks")("train")
    for round_ in range(args.rounds):
        results = run_rollouts(
            agent,
            tasks,
            samples_per_task=args.samples,
            agent_kwargs={"base_url": args.base_url, "model": args.model},
        )
        rewards = [r.reward for r in results if r.reward is not None]
        print(
            f"round {round_}: {len(results)} rollouts, mean reward {sum(rewards) / max(len(rewards), 1):.3f}"
        )
    if not tinkertrace.flush():
        sys.exit("some spans could not be delivered yet (kept in the spool)")


if __name__ == "__main__":
    main()
