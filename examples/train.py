"""Train an example agent: ``python examples/train.py examples/hello/config.yaml``.

An example's training run is *agent function + task source + config*. For every environment in the
config, the agent runs on a sample of training tasks (``rollouts_per_task`` times each) against an
OpenAI-compatible endpoint serving the model (started here on the local engine), traced into the
embedded Parquet sink; the builder turns those spans into trajectories, the environment's reward
settings are applied, and ``tinkertrace.training`` trains on the result (batch mode), saving
checkpoints; ``--resume`` continues a stopped run from its last checkpoint.

Config (YAML)::

    model: tinkertrace/tiny-chat     # base model (local engine), or a Tinker model name with backend: tinker
    backend: local                   # local | tinker
    tasks_per_env: 8                 # training tasks sampled per environment
    train: {epochs: 2, learning_rate: 1e-3, lora_rank: 8}   # any `tinkertrace train` setting
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
        reward_per_call: false       # one-call rows (parallel solvers) keep their own call's reward

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
    reward_per_call: bool = False
    split: str = "train"


@dataclass
class RunConfig:
    """A whole example run."""

    environments: list[EnvConfig]
    model: str = "tinkertrace/tiny-chat"
    backend: str = "local"
    tasks_per_env: int = 8
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
    con.execute("CREATE TEMP TABLE env_tasks AS SELECT unnest($ids::VARCHAR[]) AS task_id", {"ids": task_ids})
    con.execute("CREATE TEMP VIEW env_rollouts AS SELECT * FROM rollouts SEMI JOIN env_tasks USING (task_id)")
    con.register("traj", built.trajectories)
    con.register("trip", built.triplets)
    reward = "t.reward"
    if env.reward_per_call:  # a one-call row gets its own call's reward, not the (rollout, agent) sum
        reward = """COALESCE((SELECT p.reward FROM trip p
                     WHERE p.rollout_id = t.rollout_id AND t.num_turns = 1
                     AND list_concat(p.prompt_token_ids, p.response_token_ids) = t.tokens LIMIT 1),
                     t.reward)"""
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
        WITH failed AS (SELECT rollout_id, task_id FROM env_rollouts WHERE status = 'failed'),
             bad_groups AS (SELECT task_id FROM failed GROUP BY task_id HAVING count(*) > {failed_limit})
        SELECT t.* REPLACE (CAST({reward} AS DOUBLE) AS reward) FROM traj t
        WHERE t.rollout_id NOT IN (SELECT rollout_id FROM failed)
          AND ({failed_limit} < 0 OR t.task_id NOT IN (SELECT task_id FROM bad_groups))
        """)
        .to_arrow_table()
        .cast(built.trajectories.schema)
    )
    counts = con.execute(f"""
        SELECT count(*) AS rollouts, count(*) FILTER (WHERE status = 'failed') AS failed,
               (SELECT count(DISTINCT rollout_id) FROM rewards SEMI JOIN env_rollouts USING (rollout_id)
                WHERE name = '{TRUNCATED_REWARD}') AS truncated
        FROM env_rollouts""").fetchone()
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
    progress: bool = True,
) -> dict[str, Any]:
    """Collect rollouts, build trajectories and train; returns the run summary (also ``summary.json``).

    With ``resume``, a run whose rollouts were already collected goes straight back to training and
    continues from the last checkpoint in ``out_dir/train``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tinkertrace.training.config import make_config
    from tinkertrace.training.loop import run_training

    config = load_config(config_path, overrides)
    out_dir.mkdir(parents=True, exist_ok=True)
    trajectories_path = out_dir / "trajectories.parquet"
    rollouts_path = out_dir / "rollouts.json"
    if (out_dir / "train").exists() and not resume:
        raise FileExistsError(f"{out_dir} already holds a run; pass --resume or choose another --out")
    if not (resume and trajectories_path.exists()):
        started = time.perf_counter()
        envs: dict[str, Any] = {}
        tables = []
        with _serving(config, base_url) as url:
            tinkertrace.init(spans_dir=out_dir / "spans")
            for env in config.environments:
                pool = load_tasks(env.tasks, split=env.split)
                tasks = random.Random(f"{config.seed}/{env.name}").sample(
                    pool, min(config.tasks_per_env, len(pool))
                )
                kwargs = {"base_url": url, "model": config.model, "temperature": env.temperature}
                results = run_rollouts(
                    load_ref(env.agent),
                    tasks,
                    samples_per_task=env.rollouts_per_task,
                    agent_kwargs={**kwargs, **env.agent_kwargs},
                    concurrency=config.concurrency,
                )
                tinkertrace.flush()
                table, stats = env_trajectories(out_dir / "spans", env, [t["id"] for t in tasks])
                stats["agent_errors"] = sorted({r.error for r in results if r.error})[:5]
                envs[env.name] = stats
                tables.append(table)
        pq.write_table(pa.concat_tables(tables), trajectories_path)
        rollouts_path.write_text(
            json.dumps({"envs": envs, "elapsed_s": time.perf_counter() - started}, indent=2)
        )
    settings = {**config.train, "source": str(trajectories_path), "log_dir": str(out_dir / "train")}
    settings.update(backend=config.backend, model=config.model, resume=resume)
    result = run_training(make_config(None, settings), progress=progress)
    summary = {"rollouts": json.loads(rollouts_path.read_text()), "train": _train_record(result)}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _train_record(result: Any) -> dict[str, Any]:
    raw = asdict(result) if hasattr(result, "__dataclass_fields__") else dict(vars(result))
    return json.loads(json.dumps(raw, default=str))


class _serving:
    """Serve the base model on a free loopback port for the rollouts (or use ``base_url`` as is)."""

    def __init__(self, config: RunConfig, base_url: str | None):
        self.config, self.base_url = config, base_url

    def __enter__(self) -> str:
        if self.base_url is not None:
            return self.base_url
        from tinkertrace.netutil import BackgroundServer
        from tinkertrace.serving.app import create_app
        from tinkertrace.serving.policy import PolicyHolder
        from tinkertrace.tokenizer import load_tokenizer
        from tinkertrace.training.backends import make_service_client

        service = make_service_client(self.config.backend)
        sampler = service.create_sampling_client(base_model=self.config.model)
        policy = PolicyHolder(sampler, load_tokenizer(self.config.model), self.config.model)
        self.server = BackgroundServer(create_app(policy)).start()
        return self.server.url + "/v1"

    def __exit__(self, *exc: object) -> None:
        if self.base_url is None:
            self.server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="the example's config.yaml")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<example>)")
    parser.add_argument("--tasks-per-env", type=int, default=None, help="override the tasks per environment")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last checkpoint"
    )
    parser.add_argument("--base-url", default=None, help="collect rollouts from this endpoint instead")
    args = parser.parse_args()
    out = args.out or Path("runs") / args.config.resolve().parent.name
    summary = train(
        args.config,
        out,
        resume=args.resume,
        overrides={"tasks_per_env": args.tasks_per_env},
        base_url=args.base_url,
    )
    for name, stats in summary["rollouts"]["envs"].items():
        print(f"{name}: {stats['rollouts']} rollouts, mean reward {stats['mean_reward']:.3f}")
    print(f"trained {summary['train']['steps']} steps; checkpoints and metrics in {out / 'train'}")


if __name__ == "__main__":
    main()
