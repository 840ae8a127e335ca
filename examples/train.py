"""Train an example agent on-policy: ``python examples/train.py examples/hello/config.yaml``.

An example's run is *agent function + task source + config* (:mod:`examples.runconfig`) handed to
the online loop (:mod:`tinkertrace.online`): the collector runs as a subprocess, the sampling
endpoint serves the model in this process, agent worker processes (:mod:`examples.worker`) run
rollout groups against it concurrently, and the follow trainer trains on the rollouts as their spans
arrive and publishes every new version to the endpoint, which the next rollouts sample from.

Each environment's rollouts are built with its own settings (agent filter, grouping, reward
reduction, non-terminal reward, failing-rollout limit: :func:`examples.runconfig.env_trajectories`)
and reach training only as complete groups. Every step is checkpointed with the rollouts it trained;
``--resume`` continues a stopped run from its last checkpoint without training a rollout twice.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.runconfig import EnvConfig, RunConfig, env_of, env_trajectories, load_config
from examples.worker import CONFIG_ENV, OVERRIDES_ENV
from tinkertrace.online.follow import FollowTrainer
from tinkertrace.online.settings import FollowOptions

REPO = Path(__file__).resolve().parents[1]
STAT_KEYS = ("rollouts", "failed", "truncated", "rows")


class ExampleTrainer(FollowTrainer):
    """The follow trainer, with each environment's rollouts rebuilt under its own settings and held
    back until their group (one task id, ``rollouts_per_task`` rollouts) is complete or has waited
    ``group_timeout_s``."""

    def __init__(self, run: RunConfig, spans_dir: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.envs: dict[str, EnvConfig] = {env.name: env for env in run.environments}
        self.spans_dir = spans_dir
        self.seen: set[str] = set()
        self.arrived: dict[str, set[str]] = {}
        self.staged: dict[str, list[pa.Table]] = {}
        self.first_seen: dict[str, float] = {}
        self.released: list[pa.Table] = []
        self.stats = {name: dict.fromkeys((*STAT_KEYS, "reward_sum"), 0.0) for name in self.envs}

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self._stage(table)
        now, timeout = time.monotonic(), self.options.group_timeout_s
        for task in list(self.staged):
            expected = self.envs[env_of(task)].rollouts_per_task
            if len(self.arrived[task]) >= expected or now - self.first_seen[task] >= timeout:
                ready = [t for t in self.staged.pop(task) if t.num_rows]
                del self.arrived[task], self.first_seen[task]
                if ready:
                    rows = pa.concat_tables(ready)
                    self.released.append(rows)
                    super().add(rows)

    def _stage(self, table: pa.Table) -> None:
        """Rebuild the new rollouts' groups under their environment's settings and stage them."""
        pairs = table.select(["task_id", "rollout_id"]).group_by(["task_id", "rollout_id"]).aggregate([])
        by_env: dict[str, list[str]] = {}
        for task, rollout in zip(pairs["task_id"].to_pylist(), pairs["rollout_id"].to_pylist(), strict=True):
            self.arrived.setdefault(task, set()).add(rollout)
            self.first_seen.setdefault(task, time.monotonic())
            self.staged.setdefault(task, [])
            by_env.setdefault(env_of(task), []).append(task)
        for name, tasks in by_env.items():
            env = self.envs.get(name)
            if env is None:
                for task in set(tasks):
                    self.staged.pop(task), self.arrived.pop(task), self.first_seen.pop(task)
                continue
            rows, stats = env_trajectories(self.spans_dir, env, sorted(set(tasks)), frozenset(self.seen))
            for key in STAT_KEYS:
                self.stats[name][key] += stats[key]
            self.stats[name]["reward_sum"] += stats["mean_reward"] * stats["rows"]
            built = set(pc.unique(rows["rollout_id"]).to_pylist()) | set(pairs["rollout_id"].to_pylist())
            self.seen |= built
            for task in set(tasks):
                self.staged[task].append(rows.filter(pc.equal(rows["task_id"], task)))
                self.arrived[task] |= set(
                    pc.unique(rows.filter(pc.equal(rows["task_id"], task))["rollout_id"]).to_pylist()
                )

    def env_summary(self) -> dict[str, dict[str, float]]:
        """Per environment: rollouts built, failed, truncated, training rows and their mean reward."""
        out = {}
        for name, s in self.stats.items():
            rows = int(s["rows"])
            out[name] = {k: int(s[k]) for k in STAT_KEYS} | {
                "mean_reward": s["reward_sum"] / rows if rows else 0.0
            }
        return out


def train(
    config_path: Path,
    out_dir: Path,
    *,
    resume: bool = False,
    overrides: dict[str, Any] | None = None,
    base_url: str | None = None,
    publish_url: str | None = None,
    publish_token: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the example online until ``steps`` training steps (or ``max_seconds``); returns the
    summary, also written to ``out_dir/summary.json`` (trained rows: ``trajectories.parquet``)."""
    import pyarrow.parquet as pq

    from tinkertrace.online.publish import holder_publisher
    from tinkertrace.online.runner import OnlineStack
    from tinkertrace.online.settings import StackSettings
    from tinkertrace.training.backends import make_service_client
    from tinkertrace.training.config import make_config

    run = load_config(config_path, overrides)
    out_dir = Path(out_dir)
    if (out_dir / "train").exists() and not resume:
        raise FileExistsError(f"{out_dir} already holds a run; pass --resume or choose another --out")
    stack_settings = StackSettings(out=out_dir, model=run.model, agent_module="examples.worker")
    if run.worker_python:
        if not Path(run.worker_python).exists():
            raise FileNotFoundError(
                f"{config_path}: worker_python {run.worker_python} does not exist (see the example's README "
                "for the command that creates its environment)"
            )
        stack_settings.worker_python = run.worker_python
    settings = {**run.train, "source": str(stack_settings.spans_dir), "log_dir": str(out_dir / "train")}
    settings.update(backend=run.backend, model=run.model, groups_per_batch=run.groups_per_step)
    settings.setdefault("engine_dir", str(stack_settings.engine_dir))
    config = make_config(None, settings)
    options = FollowOptions(
        group_size=1,  # groups reach the trainer complete (ExampleTrainer stages them)
        group_timeout_s=run.group_timeout_s,
        max_staleness=run.max_staleness,
        poll_s=0.25,
        max_steps=run.steps,
        publish_url=publish_url,
        publish_token=publish_token,
    )
    service = make_service_client(run.backend) if run.backend != "local" else None
    started = time.monotonic()
    saved_env = {k: os.environ.get(k) for k in (CONFIG_ENV, OVERRIDES_ENV, "PYTHONPATH")}
    os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
    os.environ[OVERRIDES_ENV] = json.dumps(overrides or {})
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), saved_env["PYTHONPATH"]) if p)
    try:
        with OnlineStack(stack_settings, service=service) as stack:
            if base_url is not None:
                stack.base_url = base_url  # agents sample from this server instead
            trainer = ExampleTrainer(
                run,
                stack_settings.spans_dir,
                config,
                options,
                publish=None if publish_url else holder_publisher(stack.holder),
                service=stack.service,
            )
            result = stack.run_trainer(
                trainer, workers=run.workers, max_seconds=run.max_seconds, progress=progress
            )
            served = stack.holder.version
            agent_rows = stack.agent_results()
    finally:
        for key, value in saved_env.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    if trainer.released:
        pq.write_table(pa.concat_tables(trainer.released), out_dir / "trajectories.parquet")
    summary = {
        "envs": trainer.env_summary(),
        "train": {
            "start_step": result.start_step,
            "steps": result.steps,
            "rollouts_trained": result.rollouts_trained,
            "dropped_stale": result.rollouts_dropped_stale,
            "dropped_constant": result.rollouts_dropped_constant,
            "rewards": result.rewards,
            "notes": result.notes,
        },
        "served_version": served,
        "agent_rollouts": len(agent_rows),
        "agent_errors": sorted({r["error"] for r in agent_rows if r.get("error")})[:5],
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="the example's config.yaml")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<example>)")
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps in all (overrides the config)"
    )
    parser.add_argument("--workers", type=int, default=None, help="agent worker processes (overrides)")
    parser.add_argument(
        "--backend", choices=("local", "tinker"), default=None, help="local engine or hosted Tinker"
    )
    parser.add_argument(
        "--model", default=None, help="base model (a Tinker model name with --backend tinker)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last checkpoint"
    )
    parser.add_argument(
        "--base-url", default=None, help="agents sample from this OpenAI-compatible server instead"
    )
    parser.add_argument(
        "--publish-url", default=None, help="POST each new version to this `tinkertrace serve`"
    )
    parser.add_argument(
        "--publish-token", default=os.environ.get("TINKERTRACE_ADMIN_TOKEN"), help="its admin token"
    )
    args = parser.parse_args()
    out = args.out or Path("runs") / args.config.resolve().parent.name
    overrides = {"steps": args.steps, "workers": args.workers, "backend": args.backend, "model": args.model}
    summary = train(
        args.config,
        out,
        resume=args.resume,
        overrides={k: v for k, v in overrides.items() if v is not None},
        base_url=args.base_url,
        publish_url=args.publish_url,
        publish_token=args.publish_token,
    )
    for name, stats in summary["envs"].items():
        print(f"{name}: {stats['rollouts']} rollouts, mean reward {stats['mean_reward']:.3f}")
    rewards = summary["train"]["rewards"]
    trend = f"; reward {rewards[0]:.3f} → {rewards[-1]:.3f}" if rewards else ""
    print(
        f"trained steps {summary['train']['start_step']}..{summary['train']['steps']}{trend}; "
        f"endpoint at policy v{summary['served_version']}; checkpoints and metrics in {out / 'train'}"
    )


if __name__ == "__main__":
    main()
