"""Multi-environment training: whose rollout is whose, how an environment's rollouts become training
rows, and how each step's groups are shared between environments by weight.

An environment (:class:`~tinkertrace.training.config.Environment`, the ``environments`` list of a
config file) names its rollouts' task ids ``ENV/TASK/ROUND`` (:func:`group_task_id`), so every
trajectory is told apart by the first part of its task id (:func:`env_of`). Its rollouts are built
with its own build options, then its reward settings are applied in one DuckDB query
(:func:`environment_rows`): ``reward_reduction`` over the per-call rewards, ``nonterminal_reward`` for
rollouts that emitted a ``truncated`` reward, ``max_failing_rollouts`` dropping a whole group.
Batch and follow mode both fill each step's ``groups_per_batch`` slots with a smooth weighted
round robin over the environments (:class:`WeightedTurns`), so each gets its ``weight`` share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tinkertrace.settings import ConfigError
from tinkertrace.training.config import Environment
from tinkertrace.training.errors import DataError

if TYPE_CHECKING:  # pyarrow only where rows are handled; the agent workers import this module's names
    import pyarrow as pa

TRUNCATED_REWARD = "truncated"
SQL_REDUCTIONS = {
    "sum": "sum(reward)",
    "mean": "avg(reward)",
    "max": "max(reward)",
    "min": "min(reward)",
    "last": "arg_max(reward, turn)",
}
STAT_KEYS = ("rollouts", "failed", "truncated", "groups_dropped_failing", "rows")
# settings that need the spans (per-call rewards, rollout status), not only built trajectories
SPAN_SETTINGS = ("build", "reward_reduction", "nonterminal_reward", "max_failing_rollouts", "reward_per_call")


def group_task_id(env: str, task_id: str, tag: str) -> str:
    """The task id of one GRPO group: environment, task, and the round that sampled it."""
    return f"{env}/{task_id}/{tag}"


def env_of(task_id: str) -> str:
    """The environment named in a :func:`group_task_id`."""
    return task_id.split("/", 1)[0]


class WeightedTurns:
    """Smooth weighted round robin over environments: each :meth:`next` gives the turn to the
    environment furthest behind its share, so any run of ``n`` turns holds each one ``n × share``
    times up to one (weights 3:1 give A A B A, A A B A, ...)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)
        self.credit = np.zeros_like(self.weights)

    def next(self, live: np.ndarray | None = None) -> int:
        """The next environment's index, among the ``live`` ones (a boolean mask) when given."""
        weights = self.weights if live is None else np.where(live, self.weights, 0.0)
        self.credit += weights
        chosen = int(np.argmax(np.where(weights > 0, self.credit, -np.inf)))
        self.credit[chosen] -= weights.sum()
        return chosen

    def quotas(self, count: int) -> np.ndarray:
        """How many of the next ``count`` turns each environment gets, without taking them."""
        saved = self.credit.copy()
        taken = np.bincount([self.next() for _ in range(count)], minlength=len(self.weights))
        self.credit = saved
        return taken

    def skip(self, count: int) -> None:
        """Take ``count`` turns (e.g. a worker's offset, or the groups of a step just trained)."""
        for _ in range(count):
            self.next()


def epoch_order(
    group_env: np.ndarray, weights: Sequence[float], *, seed: int, epoch: int, shuffle: bool
) -> np.ndarray:
    """Every group once, in the order the steps take them: each environment's groups in a seeded
    order, interleaved by weight; an environment that has run out of groups drops out of the turns,
    so the epoch's batches stay full."""
    rng = np.random.default_rng([seed, epoch])
    queues = []
    for env in range(len(weights)):
        members = np.flatnonzero(group_env == env)
        queues.append(rng.permutation(members) if shuffle else members)
    left = np.array([len(q) for q in queues])
    taken = np.zeros_like(left)
    turns, order = WeightedTurns(weights), []
    for _ in range(int(left.sum())):
        env = turns.next(taken < left)
        order.append(queues[env][taken[env]])
        taken[env] += 1
    return np.asarray(order, dtype=np.int64)


def group_environments(task_ids: pa.ChunkedArray | pa.Array, names: Sequence[str]) -> np.ndarray:
    """The index in ``names`` of each task id's environment (-1 for none of them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    prefix = pc.list_element(pc.split_pattern(task_ids, "/", max_splits=1), 0)
    index = pc.index_in(prefix, value_set=pa.array(list(names), pa.string()))
    return pc.fill_null(index, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def needs_spans(env: Environment) -> list[str]:
    """The settings of ``env`` that read the spans (not only built trajectories)."""
    defaults = Environment(name=env.name)
    return [name for name in SPAN_SETTINGS if getattr(env, name) != getattr(defaults, name)]


@dataclass
class EnvironmentRows:
    """An environment's training rows and what became of its rollouts."""

    table: pa.Table
    stats: dict[str, int]


def environment_rows(
    spans_dir: Path,
    env: Environment,
    task_ids: Sequence[str] | None = None,
    exclude: frozenset[str] = frozenset(),
    files: tuple[Path, ...] | None = None,
) -> EnvironmentRows:
    """The trajectories of ``env``'s rollouts (of ``task_ids``; default: every task id of the
    environment) in ``spans_dir`` (only its ``files`` when given), rollouts in ``exclude`` left out,
    built with its build options, with its reward settings applied and its failed rollouts (or
    groups, past ``max_failing_rollouts``) left out."""
    import duckdb

    from tinkertrace import schemas
    from tinkertrace.builder import BuildSettings, build_trajectories
    from tinkertrace.builder.query import open_views

    con = duckdb.connect()
    try:
        open_views(con, spans_dir, files)
        con.execute(
            "CREATE TEMP TABLE skip AS SELECT unnest($ids::VARCHAR[]) AS rollout_id", {"ids": sorted(exclude)}
        )
        if task_ids is None:
            con.execute(
                "CREATE TEMP TABLE env_tasks AS SELECT DISTINCT task_id FROM rollouts "
                "WHERE split_part(task_id, '/', 1) = $env",
                {"env": env.name},
            )
        else:
            con.execute(
                "CREATE TEMP TABLE env_tasks AS SELECT unnest($ids::VARCHAR[]) AS task_id",
                {"ids": list(task_ids)},
            )
        con.execute("""CREATE TEMP TABLE env_rollouts AS SELECT rollout_id, task_id, status FROM rollouts
                       SEMI JOIN env_tasks USING (task_id) ANTI JOIN skip USING (rollout_id)""")
        tasks = [
            row[0] for row in con.execute("SELECT DISTINCT task_id FROM env_rollouts ORDER BY 1").fetchall()
        ]
        if not tasks:
            return EnvironmentRows(schemas.trajectories().empty_table(), dict.fromkeys(STAT_KEYS, 0))
        try:
            options = BuildSettings(
                tasks=tuple(tasks),
                exclude_rollouts=exclude,
                files=files,
                **{"reward_name": "primary", **env.build},
            )
        except TypeError as exc:
            raise ConfigError(f"environment {env.name!r}: bad build option ({exc})") from None
        built = build_trajectories(spans_dir, None, options)
        con.register("traj", built.trajectories)
        con.register("trip", built.triplets)
        con.execute(
            "CREATE TEMP VIEW failing_groups AS SELECT task_id FROM env_rollouts WHERE status = 'failed' "
            f"GROUP BY task_id HAVING count(*) > {_failing_limit(env)} AND {_failing_limit(env)} >= 0"
        )
        table = con.sql(_shaping_sql(env)).to_arrow_table().cast(built.trajectories.schema)
        con.register("kept", table)
        stats = con.execute(
            f"""SELECT count(*), count(*) FILTER (WHERE status = 'failed'),
                   (SELECT count(DISTINCT rollout_id) FROM rewards SEMI JOIN env_rollouts USING (rollout_id)
                    WHERE name = '{TRUNCATED_REWARD}'),
                   (SELECT count(*) FROM failing_groups),
                   (SELECT count(*) FROM kept)
                FROM env_rollouts"""
        ).fetchone()
    finally:
        con.close()
    return EnvironmentRows(table, dict(zip(STAT_KEYS, map(int, stats or ()), strict=True)))


def _failing_limit(env: Environment) -> int:
    return -1 if env.max_failing_rollouts is None else int(env.max_failing_rollouts)


def _shaping_sql(env: Environment) -> str:
    """The query turning the built ``traj`` (and ``trip``) into the environment's training rows
    (``failing_groups``: the task ids with more failed rollouts than allowed)."""
    reward = "t.reward"
    if env.reward_reduction is not None:
        reward = f"COALESCE(reduced.r, {reward})"
    if env.reward_per_call:  # a one-call row gets its own call's reward, not the (rollout, agent) sum
        own = """(SELECT any_value(p.reward) FROM trip p WHERE p.rollout_id = t.rollout_id AND t.num_turns = 1
                  AND list_concat(p.prompt_token_ids, p.response_token_ids) = t.tokens)"""
        reward = f"COALESCE({own}, {reward})"
    if env.nonterminal_reward is not None:
        reward = (
            f"CASE WHEN cut.rollout_id IS NOT NULL THEN {float(env.nonterminal_reward)!r} ELSE {reward} END"
        )
    fn = SQL_REDUCTIONS[env.reward_reduction or "sum"]
    return f"""
    WITH reduced AS (SELECT rollout_id, agent_name, {fn} AS r FROM trip
                     WHERE reward IS NOT NULL GROUP BY ALL),
         cut AS (SELECT DISTINCT rollout_id FROM rewards WHERE name = '{TRUNCATED_REWARD}')
    SELECT t.* REPLACE (CAST({reward} AS DOUBLE) AS reward)
    FROM traj t
    LEFT JOIN reduced ON reduced.rollout_id = t.rollout_id
                     AND reduced.agent_name IS NOT DISTINCT FROM t.agent_name
    LEFT JOIN cut ON cut.rollout_id = t.rollout_id
    WHERE t.rollout_id IN (SELECT rollout_id FROM env_rollouts WHERE status IS DISTINCT FROM 'failed')
      AND t.task_id NOT IN (SELECT task_id FROM failing_groups)
    ORDER BY t.task_id, t.rollout_id, t.agent_name, t.segment
    """


def load_environments(
    source: Path, environments: Sequence[Environment], trajectories: pa.Table | None
) -> tuple[pa.Table, dict[str, dict[str, int]], list[str]]:
    """Batch mode: every environment's training rows from ``source`` (a spans folder), or, given the
    already built ``trajectories`` of a trajectories source, those rows split by environment (then no
    environment may set a reward setting that reads the spans). Also the per-environment counts and
    notes on rows of no listed environment."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from tinkertrace import schemas

    names = [env.name for env in environments]
    if trajectories is not None:
        wanting = {env.name: needs_spans(env) for env in environments if needs_spans(env)}
        if wanting:
            raise ConfigError(
                f"{source} holds built trajectories, but these environment settings read the spans: "
                + "; ".join(f"{n}: {', '.join(s)}" for n, s in wanting.items())
                + " (train on the spans folder instead)"
            )
        index = group_environments(trajectories["task_id"], names)
        notes = (
            [f"left out {int((index < 0).sum())} rows of no listed environment"] if (index < 0).any() else []
        )
        kept = trajectories.filter(pa.array(index >= 0))
        stats = {}
        for i, name in enumerate(names):
            rows = kept.filter(pa.array(index[index >= 0] == i))
            rollouts = len(pc.unique(rows["rollout_id"]))
            stats[name] = {**dict.fromkeys(STAT_KEYS, 0), "rollouts": rollouts, "rows": rows.num_rows}
        return kept, stats, notes
    parts = {env.name: environment_rows(source, env) for env in environments}
    empty = [name for name, part in parts.items() if part.table.num_rows == 0]
    if len(empty) == len(parts):
        raise DataError(f"no rollouts of the environments {', '.join(names)} in {source} (task ids ENV/...)")
    notes = [f"environment {name!r} has no rollouts in {source}" for name in empty]
    tables = [part.table for part in parts.values()]
    table = pa.concat_tables(tables) if tables else schemas.trajectories().empty_table()
    return table, {name: part.stats for name, part in parts.items()}, notes


def environment_metrics(task_ids: pa.Array, rewards: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Per environment, the mean reward and number of the given trajectories (one task id and reward
    each): ``env/NAME/reward/total`` and ``env/NAME/total_episodes``, as the cookbook names them."""
    index = group_environments(task_ids, names)
    counts = np.bincount(index[index >= 0], minlength=len(names))
    sums = np.bincount(index[index >= 0], weights=rewards[index >= 0], minlength=len(names))
    out: dict[str, Any] = {}
    for i, name in enumerate(names):
        out[f"env/{name}/total_episodes"] = int(counts[i])
        out[f"env/{name}/reward/total"] = float(sums[i] / counts[i]) if counts[i] else float("nan")
    return out
