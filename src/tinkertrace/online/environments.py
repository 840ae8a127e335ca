"""Follow mode over several environments: groups held until complete, and the agents run for them.

:class:`GroupStager` holds each group (the rollouts of one ``ENV/TASK/ROUND`` task id) until it holds
its environment's ``group_size`` rollouts, or has waited ``group_timeout_s``; then builds the whole
group with its environment's build options and reward settings
(:func:`~tinkertrace.training.environments.environment_rows`), so ``max_failing_rollouts`` sees the
whole group. :func:`train_with_agents` is ``tinkertrace train --follow`` for a config whose
environments name their agent: it starts the collector, the sampling endpoint and agent worker
processes (:mod:`tinkertrace.online.env_worker`) under ``LOG_DIR`` and follows their spans.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace import schemas
from tinkertrace.online.env_worker import SPEC_ENV
from tinkertrace.ors.upload import upload_settings, upload_spool
from tinkertrace.training.config import Environment, TrainConfig
from tinkertrace.training.environments import STAT_KEYS, env_of, environment_rows
from tinkertrace.training.errors import ConfigError

WORKER_MODULE = "tinkertrace.online.env_worker"


class GroupStager:
    """Holds the new rollouts of each group until the group is complete, then builds it."""

    def __init__(self, environments: Sequence[Environment], spans_dir: Path, timeout_s: float) -> None:
        self.envs = {env.name: env for env in environments}
        self.spans_dir = Path(spans_dir)
        self.timeout_s = timeout_s
        self.arrived: dict[str, set[str]] = {}  # task id → rollouts built so far
        self.first_seen: dict[str, float] = {}
        self.files: dict[str, set[Path]] = {}  # task id → the span files its rollouts were built from
        self.stats = {name: dict.fromkeys(STAT_KEYS, 0) for name in self.envs}
        self.foreign: set[str] = set()  # rollouts of no listed environment
        self.released: set[str] = set()  # rollouts already handed on (a group's rebuild may find some early)

    def stage(self, table: pa.Table, files: Sequence[Path] = ()) -> None:
        """Note the rollouts of newly built trajectories (their rows are rebuilt on release, from
        ``files``, the span files they were built from, when given; else from the whole folder)."""
        if table.num_rows == 0:
            return
        pairs = table.select(["task_id", "rollout_id"]).group_by(["task_id", "rollout_id"]).aggregate([])
        now = time.monotonic()
        for task, rollout in zip(pairs["task_id"].to_pylist(), pairs["rollout_id"].to_pylist(), strict=True):
            if rollout in self.released:
                continue
            if task is None or env_of(task) not in self.envs:
                self.foreign.add(rollout)
                continue
            self.arrived.setdefault(task, set()).add(rollout)
            self.first_seen.setdefault(task, now)
            self.files.setdefault(task, set()).update(files)

    def release(self, exclude: set[str]) -> pa.Table:
        """The rows of every group now complete (or waited out), built per environment; rollouts in
        ``exclude`` (trained or dropped) left out."""
        now = time.monotonic()
        ready: dict[str, Any] = {}
        for task, rollouts in self.arrived.items():
            env = self.envs[env_of(task)]
            if len(rollouts) >= env.group_size or now - self.first_seen[task] >= self.timeout_s:
                ready.setdefault(env.name, []).append(task)
        tables = []
        for name, tasks in ready.items():
            files = set().union(*(self.files[task] for task in tasks))
            if not all(self.files[task] for task in tasks):
                files = set()  # some rollouts came without their files: read the whole folder
            skip = frozenset(exclude | self.released)
            part = environment_rows(
                self.spans_dir, self.envs[name], tasks, skip, tuple(sorted(files)) or None
            )
            self.released.update(pc.unique(part.table["rollout_id"]).to_pylist())
            for key, value in part.stats.items():
                self.stats[name][key] += value
            tables.append(part.table)
            for task in tasks:
                self.released |= self.arrived.pop(task)
                del self.first_seen[task], self.files[task]
        return pa.concat_tables(tables) if tables else schemas.trajectories().empty_table()


def rollouts_per_step(environments: Sequence[Environment], groups_per_batch: int) -> int:
    """Rollouts one step trains when each environment gets its weight share of the groups."""
    total = sum(env.weight for env in environments)
    return max(1, round(groups_per_batch * sum(env.weight * env.group_size for env in environments) / total))


def select_by_weight(
    env_of_group: pa.Array, waited: Any, quotas: Sequence[int], timeout_s: float
) -> list[int] | None:
    """Which ready groups (their environment's index, seconds waited) a step trains: each
    environment's quota, oldest first, once every quota can be met; or, once the oldest group has
    waited ``timeout_s``, what is ready (quotas first, then the oldest of the rest), up to the total."""
    import numpy as np

    env_index = np.asarray(env_of_group)
    order = np.argsort(-np.asarray(waited), kind="stable")
    picked: list[int] = []
    short = False
    for env, quota in enumerate(quotas):
        mine = [int(i) for i in order if env_index[i] == env][:quota]
        short |= len(mine) < quota
        picked.extend(mine)
    if short:
        if len(order) == 0 or np.max(waited) < timeout_s:
            return None
        rest = [int(i) for i in order if int(i) not in picked]
        picked.extend(rest[: sum(quotas) - len(picked)])
    return picked or None


def train_with_agents(
    config: TrainConfig, options: Any, *, console: Any = None, progress: bool = True, stop: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Follow mode with the environments' agents run here: collector, endpoint and ``workers`` agent
    worker processes under ``config.log_dir`` (``spans/``, ``agents/``, ``engine/``), trained until
    ``max_steps``, ``max_seconds`` or ``stop``. Returns the follow result and a summary (per
    environment counts, agent rollouts and errors), also written to ``LOG_DIR/summary.json``."""
    from tinkertrace.online.follow import FollowTrainer
    from tinkertrace.online.publish import holder_publisher
    from tinkertrace.online.runner import OnlineStack
    from tinkertrace.online.settings import StackSettings
    from tinkertrace.training.backends import make_service_client

    log_dir = Path(config.log_dir)
    spans = log_dir / "spans"
    if config.source is not None and Path(config.source).resolve() != spans.resolve():
        raise ConfigError(f"the environments' agents write their spans to {spans}: leave the source out")
    if options.worker_python and not Path(options.worker_python).exists():
        raise ConfigError(f"worker_python {options.worker_python} does not exist")
    config = dataclasses.replace(config, source=spans)
    for env in config.environments:
        if env.openreward:
            check_openreward(env)
    settings = StackSettings(
        out=log_dir,
        model=config.model,
        agent_module=WORKER_MODULE,
        worker_python=options.worker_python or sys.executable,
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    spec = log_dir / "agents" / "environments.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    uploads, note = upload_settings(config.openreward_run_name, log_dir / "agents" / "openreward")
    if note and console is not None:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    spec.write_text(json.dumps(worker_spec(config, uploads), indent=2))
    settings.worker_env = {SPEC_ENV: str(spec)}
    service = make_service_client(config.backend, engine_dir=config.engine_dir or settings.engine_dir)
    started = time.monotonic()
    with OnlineStack(settings, service=service) as stack:
        if options.sample_url:
            stack.base_url = options.sample_url
        publish = None if options.publish_url else holder_publisher(stack.holder)
        trainer = FollowTrainer(config, options, publish=publish, service=stack.service)
        result = stack.run_trainer(
            trainer,
            workers=options.workers,
            max_seconds=options.max_seconds,
            progress=progress,
            stop=stop,
            console=console,
        )
        served, agent_rows = stack.holder.version, stack.agent_results()
    if uploads:
        uploaded = upload_spool(Path(uploads["upload_spool"]))
        if console is not None:
            console.print(f"openreward: {uploaded}", highlight=False, soft_wrap=True)
    summary = {
        "environments": result.environments,
        "steps": result.steps,
        "start_step": result.start_step,
        "rollouts_trained": result.rollouts_trained,
        "rewards": result.rewards,
        "served_version": served,
        "agent_rollouts": len(agent_rows),
        "agent_errors": sorted({r["error"] for r in agent_rows if r.get("error")})[:5],
        "notes": result.notes,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return result, summary


def check_openreward(env: Environment) -> None:
    """ConfigError unless ``env``'s ORS server answers with tasks in its split (checked once at start,
    so a wrong URL or name is one clear error, not workers failing every rollout)."""
    from tinkertrace.ors.agent import load_tasks
    from tinkertrace.ors.client import OrsError

    try:
        tasks = load_tasks(env.split, openreward=str(env.openreward))
    except OrsError as exc:
        raise ConfigError(f"environment {env.name!r} (openreward {env.openreward!r}): {exc}") from None
    if not tasks:
        raise ConfigError(f"environment {env.name!r}: its server lists no tasks in split {env.split!r}")


def worker_spec(config: TrainConfig, uploads: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the agent workers need: the model to request, the seed, this run's id, the environments
    (an OpenReward environment's agent also gets the ``uploads`` arguments)."""
    environments = [dataclasses.asdict(env) for env in config.environments]
    for env in environments:
        if env["openreward"] and uploads:
            env["agent_kwargs"] = {**uploads, **env["agent_kwargs"]}
    return {
        "model": config.model,
        "seed": config.seed,
        "run": uuid.uuid4().hex[:6],  # in every group's task id: a resumed run's groups are new groups
        "environments": environments,
    }
