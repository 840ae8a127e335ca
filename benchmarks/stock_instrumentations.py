"""Figures for docs/builder.md: a three-call agent traced only by each real instrumentation package
(in ``.venv-instrumentations``), exported to a real collector, the model served by the real endpoint;
then built. Prints, per instrumentation: rollouts, LLM spans recognised, triplets, token source, how
many prompt/response ids equal what the endpoint sampled, rewards matched, build exit status.

    .venv/bin/python benchmarks/stock_instrumentations.py [--rollouts 20] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import record
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "instrumentations"))

from conftest import Model, run_agent  # noqa: E402

from tinkertrace.builder import BuildSettings, build_trajectories  # noqa: E402
from tinkertrace.cli.main import app  # noqa: E402
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer  # noqa: E402
from tinkertrace.netutil import BackgroundServer  # noqa: E402
from tinkertrace.serving.app import create_app  # noqa: E402
from tinkertrace.serving.policy import PolicyHolder  # noqa: E402
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler  # noqa: E402

MEASURES = (
    "src/tinkertrace/builder",
    "tests/instrumentations/requirements.txt",
    "collector",
    "src/tinkertrace/serving",
)

INSTRUMENTATIONS = ("openinference", "openllmetry", "openai-v2", "openai-v2-messages", "logfire")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--only", nargs="+", choices=INSTRUMENTATIONS, help="run these instrumentations only")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args, variant="-".join(args.only or []))
    tokenizer = load_tokenizer(BUILTIN_MODEL)
    model = Model()
    sampler = ScriptedTinkerSampler(model)
    endpoint = create_app(PolicyHolder(sampler, tokenizer, "test-model"))
    print("| instrumentation | rollouts | LLM spans recognised | triplets | token source | exact prompt ids "
          "| exact response ids | rewards matched | exit without --tokenizer |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    with BackgroundServer(endpoint) as server, tempfile.TemporaryDirectory() as tmp:
        for name in args.only or INSTRUMENTATIONS:
            first = len(sampler.calls)
            spans = Path(tmp) / name
            run_agent(name, args.rollouts, spans, server.url + "/v1")
            prompts = [p for p, *_ in sampler.calls[first:]]
            eos = tokenizer.eos_token_id
            responses = [[*tokenizer.encode(r, add_special_tokens=False), eos] for r in model.replies[first:]]
            plain = CliRunner().invoke(app, ["build-trajectories", str(spans), "-o", str(Path(tmp) / "x")])
            options = BuildSettings(task_key="task.id", tokenizer=BUILTIN_MODEL, reward_policy="link")
            built = build_trajectories(spans, Path(tmp) / f"{name}-out", options)
            s = built.summary
            calls = built.triplets.to_pylist()
            # each call of rollout k answers in its own way (k is in its text): key the sampled ids by
            # (turn, response) to find each triplet's own sampled call
            sampled = {(i % 3, tuple(r)): p for i, (p, r) in enumerate(zip(prompts, responses, strict=True))}
            own = [sampled.get((c["turn"], tuple(c["response_token_ids"]))) for c in calls]
            exact_r = sum(o is not None for o in own)
            exact_p = sum(o == c["prompt_token_ids"] for o, c in zip(own, calls, strict=True))
            sources = ", ".join(f"{k} {v}" for k, v in s.triplets_by_token_source.items())
            print(f"| {name} | {s.rollouts_built} | {sum(s.llm_spans_by_producer.values())} | {s.triplets} | "
                  f"{sources} | {exact_p}/{s.triplets} | {exact_r}/{s.triplets} | "
                  f"{s.rewards_matched}/{s.rewards} | {plain.exit_code} |")  # fmt: skip
            key, what = record.slug(name), f"{name}, {args.rollouts} rollouts"
            result.add(f"{key}_triplets", s.triplets, "triplets", f"{what}: triplets built")
            result.add(
                f"{key}_exact_prompt_ids", exact_p, "triplets", f"{what}: prompt ids equal to the sampled"
            )
            result.add(
                f"{key}_exact_response_ids", exact_r, "triplets", f"{what}: response ids equal to the sampled"
            )
            result.add(f"{key}_rewards_matched", s.rewards_matched, "rewards", f"{what}: of {s.rewards}")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    result.save()


if __name__ == "__main__":
    main()
