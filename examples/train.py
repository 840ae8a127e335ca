"""Train an example agent: ``python examples/train.py examples/hello/config.yaml``.

An example's training run is *agent function + task source + config*. Each step, for every
environment in the config: run the agent on a batch of training tasks against an OpenAI-compatible
endpoint serving the current policy (started here on the local engine), tracing into the embedded
Parquet sink; build trajectories from those spans; apply the environment's reward settings; then train
one step with ``tinkertrace.training`` and serve the new weights. This is the batch form of the online
loop; state is checkpointed after every step and ``--resume`` continues a stopped run.

Config (YAML)::

    model: tinkertrace/tiny-chat     # base model (local engine), or a Tinker model name with backend: tinker
    backend: local                   # local | tinker
    steps: 8                         # training steps
    tasks_per_step: 4                # tasks per environment per step
    train: {learning_rate: 1e-3, lora_rank: 8}   # any `tinkertrace train` setting
    environments:
      - name: hello
        agent: agent.py:introduce    # path (relative to the config) or module, then :function
        tasks: agent.py:load_tasks
        rollouts_per_task: 4         # GRPO group size
        temperature: 1.0
        agent_kwargs: {}             # extra keyword arguments for the agent
        build: {}                    # BuildOptions fields, e.g. {agent: player, group_by: task+agent}
        reward_reduction: null       # sum | mean | max | min over the per-step rewards of a trajectory
        nonterminal_reward: null     # reward of rollouts that ended without finishing (a `truncated` reward)
        max_failed_per_group: null   # drop a task's group when more of its rollouts than this failed

Top-level keys other than ``environments`` are defaults for every environment.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

import tinkertrace
from tinkertrace.evaluation import load_ref, load_tasks, run_rollouts

REDUCTIONS = ("sum", "mean", "max", "min")
TRUNCATED_REWARD = "truncated"


@dataclass
class EnvConfig:
    """One environment: an agent, its tasks and how its rollouts become training data."""

    name: str
    agent: str
    tasks: str
    rollouts_per_task: int = 4
    temperature: float = 1.0
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    reward_reduction: str | None = None
    nonterminal_reward: float | None = None
    max_failed_per_group: int | None = None
    split: str = "train"


@dataclass
class RunConfig:
    """A whole example run."""

    environments: list[EnvConfig]
    model: str = "tinkertrace/tiny-chat"
    backend: str = "local"
    steps: int = 4
    tasks_per_step: int = 4
    concurrency: int = 8
    seed: int = 0
    train: dict[str, Any] = field(default_factory=dict)


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read an example config; relative agent/task file references resolve against its folder."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    env_keys = {f.name for f in fields(EnvConfig)}
    run_keys = {f.name for f in fields(RunConfig)}
    unknown = set(data) - env_keys - run_keys
    if unknown:
        raise ValueError(f"{path}: unknown settings {sorted(unknown)}")
    defaults = {k: v for k, v in data.items() if k in env_keys and k not in run_keys}
    envs = []
    for raw in data.get("environments") or [{"name": Path(path).parent.name}]:
        merged = {**defaults, **raw}
        bad = set(merged) - env_keys
        if bad:
            raise ValueError(f"{path}: environment {raw.get('name')!r} has unknown settings {sorted(bad)}")
        env = EnvConfig(**merged)
        env.agent, env.tasks = (_resolve(Path(path).parent, r) for r in (env.agent, env.tasks))
        if env.reward_reduction not in (None, *REDUCTIONS):
            raise ValueError(f"{path}: reward_reduction of {env.name!r} must be one of {REDUCTIONS}")
        envs.append(env)
    run = {k: v for k, v in data.items() if k in run_keys and k != "environments"}
    return RunConfig(environments=envs, **run)


def _resolve(folder: Path, ref: str) -> str:
    module, _, attr = ref.rpartition(":")
    return f"{(folder / module).resolve()}:{attr}" if module.endswith(".py") else ref


# --- turning one step's spans into training rows --------------------------------------------------


def env_trajectories(spans_dir: Path, env: EnvConfig, task_ids: list[str]) -> tuple[Any, dict[str, float]]:
    """The environment's trajectories from ``spans_dir`` after its reward settings, and counts."""
    import duckdb

    from tinkertrace.builder import BuildOptions, build_trajectories
    from tinkertrace.builder.views import open_views

    options = BuildOptions(tasks=tuple(task_ids), reward_name="primary", **env.build)
    built = build_trajectories(spans_dir, None, options)
    con = duckdb.connect()
    open_views(con, spans_dir)
    con.register("traj", built.trajectories)
    con.register("trip", built.triplets)
    reward = "t.reward"
    if env.reward_reduction:
        fn = {"sum": "sum", "mean": "avg", "max": "max", "min": "min"}[env.reward_reduction]
        con.execute(f"""CREATE TEMP VIEW reduced AS SELECT rollout_id, agent_name, {fn}(reward) AS r
                        FROM trip WHERE reward IS NOT NULL GROUP BY ALL""")
        reward = """COALESCE((SELECT r FROM reduced d WHERE d.rollout_id = t.rollout_id
                              AND d.agent_name IS NOT DISTINCT FROM t.agent_name), t.reward)"""
    if env.nonterminal_reward is not None:
        truncated = f"SELECT rollout_id FROM rewards WHERE name = '{TRUNCATED_REWARD}'"
        reward = f"""CASE WHEN t.rollout_id IN ({truncated})
                     THEN {float(env.nonterminal_reward)} ELSE {reward} END"""
    failed_limit = -1 if env.max_failed_per_group is None else int(env.max_failed_per_group)
    table = (
        con.execute(f"""
        WITH failed AS (SELECT rollout_id, task_id FROM rollouts WHERE status = 'failed'),
             bad_groups AS (SELECT task_id FROM failed GROUP BY task_id HAVING count(*) > {failed_limit})
        SELECT t.* REPLACE (CAST({reward} AS DOUBLE) AS reward) FROM traj t
        WHERE t.rollout_id NOT IN (SELECT rollout_id FROM failed)
          AND ({failed_limit} < 0 OR t.task_id NOT IN (SELECT task_id FROM bad_groups))
        """)
        .fetch_arrow_table()
        .cast(built.trajectories.schema)
    )
    counts = con.execute(f"""
        SELECT count(*) AS rollouts, count(*) FILTER (WHERE status = 'failed') AS failed,
               (SELECT count(DISTINCT rollout_id) FROM rewards WHERE name = '{TRUNCATED_REWARD}') AS truncated
        FROM rollouts""").fetchone()
    stats = {"rollouts": counts[0], "failed": counts[1], "truncated": counts[2], "rows": table.num_rows}
    stats["mean_reward"] = (
        float(table["reward"].to_numpy(zero_copy_only=False).mean()) if table.num_rows else 0.0
    )
    return table, stats


# --- the run -----------------------------------------------------------------------------------------


def train(
    config_path: Path,
    out_dir: Path,
    *,
    resume: bool = False,
    overrides: dict[str, Any] | None = None,
    base_url: str | None = None,
    on_step: Any = None,
) -> list[dict[str, Any]]:
    """Run the example's training; returns one metrics record per step (also in ``metrics.jsonl``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tinkertrace.training.config import make_config
    from tinkertrace.training.loop import run_training

    config = load_config(config_path, overrides)
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / "state.json"
    state = json.loads(state_path.read_text()) if resume and state_path.exists() else {"step": 0}
    if not resume and state_path.exists():
        raise FileExistsError(f"{out_dir} already holds a run; pass --resume or choose another --out")
    agents = {env.name: load_ref(env.agent) for env in config.environments}
    pools = {env.name: load_tasks(env.tasks, split=env.split) for env in config.environments}
    history: list[dict[str, Any]] = []
    with _serving(config, out_dir, state.get("sampler_path"), base_url) as (url, policy):
        for step in range(state["step"], config.steps):
            started = time.perf_counter()
            step_dir = out_dir / f"step-{step:04d}"
            tinkertrace.init(spans_dir=step_dir / "spans")
            record: dict[str, Any] = {"step": step, "envs": {}}
            tables = []
            for env in config.environments:
                rng = random.Random(f"{config.seed}/{env.name}/{step}")
                tasks = rng.sample(pools[env.name], min(config.tasks_per_step, len(pools[env.name])))
                kwargs = {"base_url": url, "model": config.model, "temperature": env.temperature}
                run_rollouts(
                    agents[env.name],
                    tasks,
                    samples_per_task=env.rollouts_per_task,
                    agent_kwargs={**kwargs, **env.agent_kwargs},
                    concurrency=config.concurrency,
                )
                tinkertrace.flush()
                table, stats = env_trajectories(step_dir / "spans", env, [t["id"] for t in tasks])
                record["envs"][env.name] = stats
                tables.append(table)
            trajectories = pa.concat_tables(tables)
            pq.write_table(trajectories, step_dir / "trajectories.parquet")
            settings = {**config.train, "epochs": 1, "log_dir": str(out_dir / "train")}
            settings.update(source=str(step_dir / "trajectories.parquet"), backend=config.backend)
            settings.update(model=config.model, resume=step > 0, save_every=1)
            result = run_training(make_config(None, settings))
            record["train"] = _train_record(result)
            sampler_path = record["train"].get("sampler_path")
            if sampler_path and policy is not None:
                policy.load(sampler_path)
            record["elapsed_s"] = round(time.perf_counter() - started, 2)
            history.append(record)
            with (out_dir / "metrics.jsonl").open("a") as handle:
                handle.write(json.dumps(record, default=str) + "\n")
            state = {"step": step + 1, "sampler_path": sampler_path}
            state_path.write_text(json.dumps(state))
            if on_step is not None:
                on_step(record)
    tinkertrace.flush()
    return history


def _train_record(result: Any) -> dict[str, Any]:
    raw = asdict(result) if hasattr(result, "__dataclass_fields__") else dict(vars(result))
    return json.loads(json.dumps(raw, default=str))


class _serving:
    """Serve the current policy on a free loopback port (or use ``base_url`` as is)."""

    def __init__(self, config: RunConfig, out_dir: Path, sampler_path: str | None, base_url: str | None):
        self.config, self.out_dir, self.sampler_path, self.base_url = config, out_dir, sampler_path, base_url

    def __enter__(self) -> tuple[str, Any]:
        if self.base_url is not None:
            return self.base_url, None
        from tinkertrace.netutil import BackgroundServer
        from tinkertrace.serving.app import create_app
        from tinkertrace.serving.policy import PolicyHolder
        from tinkertrace.tokenizer import load_tokenizer
        from tinkertrace.training.backends import make_service_client

        service = make_service_client(self.config.backend)
        loader = lambda path: service.create_sampling_client(model_path=path)  # noqa: E731
        sampler = (
            loader(self.sampler_path)
            if self.sampler_path
            else service.create_sampling_client(base_model=self.config.model)
        )
        policy = PolicyHolder(sampler, load_tokenizer(self.config.model), self.config.model, loader=loader)
        self.server = BackgroundServer(create_app(policy)).start()
        return self.server.url + "/v1", policy

    def __exit__(self, *exc: object) -> None:
        if self.base_url is None:
            self.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="the example's config.yaml")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<example>)")
    parser.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    parser.add_argument("--tasks-per-step", type=int, default=None, help="override tasks per step")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last step")
    parser.add_argument(
        "--base-url", default=None, help="use this endpoint instead of serving the model here"
    )
    args = parser.parse_args()
    out = args.out or Path("runs") / args.config.resolve().parent.name
    history = train(
        args.config,
        out,
        resume=args.resume,
        overrides={"steps": args.steps, "tasks_per_step": args.tasks_per_step},
        base_url=args.base_url,
        on_step=lambda r: print(
            json.dumps({"step": r["step"], **{k: v["mean_reward"] for k, v in r["envs"].items()}})
        ),
    )
    print(f"{len(history)} steps; metrics in {out / 'metrics.jsonl'}")


if __name__ == "__main__":
    main()
