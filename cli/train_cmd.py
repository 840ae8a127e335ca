"""`tinkertrace train`: RL on trajectories (or spans, built first) on the local engine or hosted Tinker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, with_settings
from tinkertrace.cli.paths import existing, local
from tinkertrace.online.settings import FollowSettings, make_follow_options
from tinkertrace.training.config import TrainSettings, make_config


@with_settings
def train(
    settings: dict[str, Any] = OptionsOf(TrainSettings),
    config: Annotated[Path | None, config_option(TrainSettings, FollowSettings, section="train")] = None,
    progress: Annotated[bool, typer.Option(help="Show the live progress bar.")] = True,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="Follow mode: watch the spans folder, train on new complete rollouts as they arrive, "
            "checkpoint and publish every step; restarting resumes without retraining a rollout.",
        ),
    ] = False,
    follow_settings: dict[str, Any] = OptionsOf(FollowSettings, "--follow: "),
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE laid over the --config file, repeatable; dotted keys reach into tables and into "
            "environments by name (environments.NAME.group_size=8). Values are YAML scalars.",
        ),
    ] = None,
) -> None:
    """Train the policy with RL on traced trajectories, on the local engine or hosted Tinker.

    Each step takes --groups-per-batch groups, turns their trajectories into Tinker Datums (advantage
    on sampled tokens only), and runs forward_backward + optim_step. Metrics go to LOG_DIR/metrics.jsonl,
    checkpoints to LOG_DIR/checkpoints.jsonl.

    With an 'environments' list (or mapping) in --config, each environment's rollouts (task ids ENV/...)
    are built with its own settings and get its weight share of every step; with --follow (or no
    source) and environments that name an agent or an OpenReward environment, the agents are run here
    (collector, endpoint and --workers under LOG_DIR).
    """
    import dataclasses

    from rich.console import Console

    from tinkertrace.settings import UserError, parse_key_values
    from tinkertrace.training.backends import resolve_backend
    from tinkertrace.training.loop import run_training

    console = Console(stderr=True)
    try:
        edits = parse_key_values(set_ or [], what="--set", split_commas=False)
        train_config = make_config(config, settings, edits)
        backend, why = resolve_backend(train_config.backend)
        train_config = dataclasses.replace(train_config, backend=backend)
        console.print(
            f"tinkertrace train: {why}, model {train_config.model}", highlight=False, soft_wrap=True
        )
        if not follow and train_config.source is None and any(env.agent for env in train_config.environments):
            console.print("no source given: running the environments' agents (follow mode)", highlight=False)
            follow = True
        runs_agents = any(env.agent for env in train_config.environments)
        if train_config.source is not None and runs_agents:  # the agents' collector creates it
            local(train_config.source, "spans folder")
        elif train_config.source is not None and follow:
            # the collector creates its folder when it starts: one missing now is a typo or a collector
            # not started yet, and following it would wait forever on nothing
            existing(
                train_config.source,
                "spans folder to follow",
                hint="start the collector first (it creates its folder), or create the folder",
            )
        elif train_config.source is not None:
            existing(train_config.source, "training source", folder=False)
        if follow:
            _follow(train_config, make_follow_options(config, follow_settings), console, progress)
            return
        result = run_training(train_config, progress=progress, console=console)
    except UserError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    final = result.final_checkpoint
    console.print(
        f"trained steps {result.start_step}..{result.steps} of {result.total_steps}; "
        f"logs in {result.log_dir}",
        highlight=False,
        soft_wrap=True,
    )
    if final is not None:
        typer.echo(f"sampler weights: {final['sampler_path']}")
        typer.echo(f"state: {final['state_path']}")


def _follow(settings: Any, options: Any, console: Any, progress: bool) -> None:
    """`train --follow`: run the follow trainer until stopped (Ctrl-C) or --max-steps."""
    import signal
    import threading

    from tinkertrace.online.environments import train_with_agents
    from tinkertrace.online.follow import FollowTrainer

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        """SIGTERM or a first Ctrl-C: stop as a finished run does (workers, sessions, summary); a second
        Ctrl-C: at once. A KeyboardInterrupt raised wherever the main thread waited could leave a
        clean-up half done and the run hanging."""
        if signum == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if any(env.agent for env in settings.environments):
            result, summary = train_with_agents(
                settings, options, console=console, progress=progress, stop=stop
            )
            for name, stats in summary["environments"].items():
                console.print(f"{name}: {stats}", highlight=False, soft_wrap=True)
        else:
            result = FollowTrainer(settings, options).run(stop=stop, console=console, progress=progress)
    except KeyboardInterrupt:
        console.print("stopped")
        return
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    console.print(
        f"follow: trained steps {result.start_step}..{result.steps}, {result.rollouts_trained} rollouts, "
        f"dropped {result.rollouts_dropped_stale} stale; logs in {result.log_dir}",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add `tinkertrace train` to the main app."""
    app.command("train")(needs_extra("train", "train")(train))
