"""An example's run config (agent function + task source + settings per environment) and how one
environment's rollouts become training rows (its reward settings, applied in SQL).

Config (YAML)::

    model: tinkertrace/tiny-chat     # base model (local engine), or a Tinker model with backend: tinker
    backend: local                   # local | tinker
    steps: 20                        # training steps in all (a resumed run continues up to this)
    workers: 2                       # agent worker processes
    groups_per_step: 4               # GRPO groups (one task × rollouts_per_task rollouts) per step
    max_staleness: 4                 # drop rollouts sampled more than this many versions ago
    train: {learning_rate: 1e-3, lora_rank: 8}   # any `tinkertrace train` setting
    environments:
      - name: hello
        agent: agent.py:introduce    # path (relative to the config) or module, then :function
        tasks: agent.py:load_tasks
        rollouts_per_task: 4         # GRPO group size
        temperature: 1.0
        agent_kwargs: {}             # extra keyword arguments for the agent
        build: {}                    # BuildOptions fields, e.g. {agent: "^player$", reward_policy: link}
        reward_reduction: null       # sum | mean | max | min over the per-step rewards of a trajectory
        nonterminal_reward: null     # reward of rollouts that ended without finishing (a `truncated` reward)
        max_failed_per_group: null   # drop a group when more of its rollouts than this failed
        reward_per_call: false       # one-call rows (parallel solvers) keep their own call's reward

Top-level keys other than ``environments`` that are environment settings are defaults for every
environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # the agent workers import this module in an SDK-only environment (no pyarrow)
    import pyarrow as pa

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
    steps: int = 20
    workers: int = 2
    groups_per_step: int = 4
    max_staleness: int = 4
    group_timeout_s: float = 30.0
    max_seconds: float = 900.0
    seed: int = 0
    train: dict[str, Any] = field(default_factory=dict)
    worker_python: str | None = None  # the agent workers' Python (relative to the config); default: this one


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read an example config; relative agent/task file references resolve against its folder.

    ``overrides`` replace top-level keys (``train`` is merged key by key)."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        data[key] = {**data.get("train", {}), **value} if key == "train" else value
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
        if "/" in env.name:
            raise ValueError(f"{path}: environment name {env.name!r} must not contain '/'")
        envs.append(env)
    run = {k: v for k, v in data.items() if k in run_keys and k != "environments"}
    if run.get("worker_python"):
        # absolute but not resolved: a virtualenv's python is a symlink, and resolving it leaves the env
        run["worker_python"] = os.path.normpath(Path(path).parent.absolute() / run["worker_python"])
    return RunConfig(environments=envs, **run)


def _resolve(folder: Path, ref: str) -> str:
    module, _, attr = ref.rpartition(":")
    return f"{(folder / module).resolve()}:{attr}" if module.endswith(".py") else ref


def group_task_id(env: str, task_id: str, tag: str) -> str:
    """The task id of one GRPO group: environment, task, and the round that sampled it."""
    return f"{env}/{task_id}/{tag}"


def env_of(task_id: str) -> str:
    """The environment named in a :func:`group_task_id`."""
    return task_id.split("/", 1)[0]


def env_trajectories(
    spans_dir: Path, env: EnvConfig, task_ids: list[str], exclude: frozenset[str] = frozenset()
) -> tuple[pa.Table, dict[str, Any]]:
    """The environment's trajectories for ``task_ids`` (rollouts in ``exclude`` left out) after its
    build options and reward settings, and counts (rollouts, failed, truncated, rows, mean reward)."""
    import duckdb
    import pyarrow.compute as pc

    from tinkertrace.builder import BuildOptions, build_trajectories
    from tinkertrace.builder.views import open_views

    options = BuildOptions(
        tasks=tuple(task_ids), exclude_rollouts=exclude, **{"reward_name": "primary", **env.build}
    )
    built = build_trajectories(spans_dir, None, options)
    con = duckdb.connect()
    open_views(con, spans_dir)
    con.execute("CREATE TEMP TABLE env_tasks AS SELECT unnest($ids::VARCHAR[]) AS task_id", {"ids": task_ids})
    con.execute(
        "CREATE TEMP TABLE skip AS SELECT unnest($ids::VARCHAR[]) AS rollout_id", {"ids": sorted(exclude)}
    )
    con.execute("""CREATE TEMP VIEW env_rollouts AS SELECT * FROM rollouts SEMI JOIN env_tasks USING (task_id)
                   ANTI JOIN skip USING (rollout_id)""")
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
        con.sql(f"""
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
    con.close()
    assert counts is not None
    stats: dict[str, Any] = {"rollouts": counts[0], "failed": counts[1], "truncated": counts[2]}
    stats["rows"] = table.num_rows
    stats["mean_reward"] = float(pc.mean(table["reward"]).as_py() or 0.0) if table.num_rows else 0.0
    return table, stats
