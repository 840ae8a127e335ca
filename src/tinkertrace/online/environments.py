"""``tinkertrace train --follow`` for a config whose environments name their agent.

:func:`train_with_agents` starts the collector, the sampling endpoint and agent worker processes
(:mod:`tinkertrace.online.env_worker`) under ``LOG_DIR``, and runs the follow trainer
(:mod:`tinkertrace.online.follow`, whose groups :mod:`tinkertrace.online.group_staging` holds until
complete) on their spans.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from tinkertrace.online.env_worker import SPEC_ENV
from tinkertrace.ors.upload import SpoolUploader, upload_settings
from tinkertrace.settings import ConfigError
from tinkertrace.training.config import REPLY_TOKENS, Environment, TrainSettings

WORKER_MODULE = "tinkertrace.online.env_worker"


def train_with_agents(
    config: TrainSettings, options: Any, *, console: Any = None, progress: bool = True, stop: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Follow mode with the environments' agents run here: collector, endpoint and ``workers`` agent
    worker processes under ``config.log_dir`` (``spans/``, ``agents/``, ``engine/``), trained until
    ``max_steps``, ``max_seconds`` or ``stop``. Returns the follow result and a summary (per
    environment counts, agent rollouts and errors), also written to ``LOG_DIR/summary.json``."""
    from tinkertrace.online.follow import FollowTrainer
    from tinkertrace.online.publish import holder_publisher
    from tinkertrace.online.runner import OnlineStack
    from tinkertrace.online.settings import StackSettings
    from tinkertrace.training.backends import close_service, make_service_client

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
        max_tokens=REPLY_TOKENS,  # requests that set none: never the demo's few tokens (see Environment)
        agent_module=WORKER_MODULE,
        worker_python=options.worker_python or sys.executable,
        inflight=options.inflight,
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
    status = "errored"
    uploader = SpoolUploader(Path(uploads["upload_spool"])) if uploads else None
    try:
        settings.model_path, settings.policy_version = start_weights(service, config)
        # the uploader sends each rollout as it is spooled; it stops after the workers, sending the last
        with uploader or nullcontext(), OnlineStack(settings, service=service) as stack:
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
        status = "success"
    finally:
        close_service(service, status)
    if uploader is not None and console is not None:
        console.print(f"openreward: {uploader.said}", highlight=False, soft_wrap=True)
    summary = {
        "environments": result.environments,
        "steps": result.steps,
        "start_step": result.start_step,
        "rollouts_trained": result.rollouts_trained,
        "rewards": result.rewards,
        "served_version": served,
        "start_weights": settings.model_path,  # served before the first step (None: the model's own)
        "agent_rollouts": len(agent_rows),
        "agent_errors": sorted({r["error"] for r in agent_rows if r.get("error")})[:5],
        "notes": result.notes,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return result, summary


def start_weights(service: Any, config: TrainSettings) -> tuple[str | None, int]:
    """The sampler weights the endpoint serves from the start, and their version: this log folder's
    last follow checkpoint, else ``config.resume_from``'s state saved for sampling (version 0), else
    the model's own (None). So no rollout of a resumed run is sampled from the base weights."""
    from tinkertrace.online.follow import FOLLOW_MODE
    from tinkertrace.training.checkpoints import read_checkpoints
    from tinkertrace.training.step import open_training_client

    records = read_checkpoints(Path(config.log_dir))
    if records and records[-1].get("mode") == FOLLOW_MODE:
        return records[-1]["sampler_path"], int(records[-1]["policy_version"])
    if not config.resume_from:
        return None, 0
    client = open_training_client(service, config)
    return client.save_weights_for_sampler("resume_from").result().path, 0


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


def worker_spec(config: TrainSettings, uploads: dict[str, Any] | None = None) -> dict[str, Any]:
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
