"""`tinkertrace train`: RL on trajectories (or spans, built first) on the local engine or hosted Tinker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer


def train(
    source: Annotated[
        Path | None,
        typer.Argument(
            help="Trajectories (a .parquet file, or a folder holding trajectories.parquet or "
            "trajectory files) or a spans folder, which is built into trajectories first."
            " May also come from --config."
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="'local' (the engine on this machine, default) or 'tinker' (hosted; needs TINKER_API_KEY)."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Base model: 'tinkertrace/tiny-chat[:nano|small|base]' (built in, default), a local "
            "Hugging Face folder, or a Tinker model name such as Qwen/Qwen3-8B."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="YAML or TOML file of settings (same names as these options); options win."
        ),
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="Passes over the data (default 1).")] = None,
    groups_per_batch: Annotated[
        int | None,
        typer.Option(help="Groups (tasks) per optimiser step; all of a group's rollouts go together (8)."),
    ] = None,
    learning_rate: Annotated[float | None, typer.Option(help="Adam learning rate (default 1e-4).")] = None,
    lora_rank: Annotated[
        int | None, typer.Option(help="LoRA rank (default 16); 0 trains all weights (local engine only).")
    ] = None,
    loss: Annotated[
        str | None,
        typer.Option(
            help="Loss: importance_sampling (default), ppo, cispo, dro, or cross_entropy "
            "(imitates the sampled tokens)."
        ),
    ] = None,
    loss_config: Annotated[
        list[str] | None,
        typer.Option(
            help="Loss setting key=value, repeatable: e.g. clip_low_threshold=0.8 clip_high_threshold=1.2 "
            "(ppo, cispo) or beta=0.05 (dro)."
        ),
    ] = None,
    advantage: Annotated[
        str | None,
        typer.Option(
            help="group: reward minus group mean (default); std: also divided by the group std; "
            "none: the raw reward."
        ),
    ] = None,
    group_by: Annotated[
        str | None, typer.Option(help="Group key for advantages: task (default) or task+agent.")
    ] = None,
    remove_constant_reward_groups: Annotated[
        bool | None,
        typer.Option(
            "--remove-constant-reward-groups/--keep-constant-reward-groups",
            help="Drop groups whose rollouts all got the same reward (default: drop; they carry no signal).",
        ),
    ] = None,
    max_tokens_per_datum: Annotated[
        int | None,
        typer.Option(
            help="Longest model input per sequence; longer ones keep their first tokens (default 4096)."
        ),
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder for metrics.jsonl, checkpoints.jsonl and config.json (default runs/train)."
        ),
    ] = None,
    save_every: Annotated[
        int | None, typer.Option(help="Save a checkpoint every N steps (default 10; 0 = only at the end).")
    ] = None,
    resume: Annotated[
        bool | None, typer.Option("--resume", help="Continue from the last checkpoint in --log-dir.")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the data order and the LoRA init (default 0).")
    ] = None,
    engine_dir: Annotated[
        Path | None,
        typer.Option(help="Local engine checkpoint folder (default $TINKERTRACE_HOME/engine)."),
    ] = None,
    wandb_project: Annotated[
        str | None,
        typer.Option(
            help="Also log to this Weights & Biases project (needs the wandb package; or $WANDB_PROJECT)."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show the live progress bar.")] = True,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="Follow mode: watch the spans folder, train on new complete rollouts as they arrive, "
            "checkpoint and publish every step; restarting resumes without retraining a rollout.",
        ),
    ] = False,
    max_steps: Annotated[
        int | None,
        typer.Option(help="--follow: stop after this many steps in all (default: run until stopped)."),
    ] = None,
    group_size: Annotated[
        int, typer.Option(help="--follow: rollouts a group needs before it is trained (default 4).")
    ] = 4,
    group_timeout: Annotated[
        float,
        typer.Option(
            help="--follow: train a group with at least 2 rollouts after waiting this long, seconds."
        ),
    ] = 30.0,
    max_staleness: Annotated[
        int | None,
        typer.Option(
            help="--follow: rollouts sampled more than N policy versions ago are dropped (default 4)."
        ),
    ] = 4,
    staleness_mode: Annotated[
        str,
        typer.Option(
            help="--follow: 'drop' stale rollouts, or 'downweight' (advantage × 0.5 per extra version)."
        ),
    ] = "drop",
    poll_seconds: Annotated[float, typer.Option(help="--follow: how often to look for new spans.")] = 0.5,
    idle_timeout: Annotated[
        float | None, typer.Option(help="--follow: stop after this many seconds without new rollouts.")
    ] = None,
    publish_url: Annotated[
        str | None,
        typer.Option(
            help="--follow: sampling endpoint (tinkertrace serve) to POST each new version to /admin/policy; "
            "without it, serve --watch-checkpoints LOG_DIR/checkpoints.jsonl picks them up."
        ),
    ] = None,
    publish_token: Annotated[
        str | None, typer.Option(help="--follow: the endpoint's admin token (or $TINKERTRACE_ADMIN_TOKEN).")
    ] = None,
    admission: Annotated[
        bool,
        typer.Option(
            help="--follow with --publish-url: tell the endpoint how many rollouts each step consumes, so it "
            "starts a new rollout only while it will be trained within --max-staleness versions (agents "
            "wait instead of sampling rollouts that would be dropped as stale)."
        ),
    ] = True,
) -> None:
    """Train the policy with RL on traced trajectories, on the local engine or hosted Tinker.

    Each step takes --groups-per-batch groups, turns their trajectories into Tinker Datums (advantage
    on sampled tokens only), and runs forward_backward + optim_step. Metrics go to LOG_DIR/metrics.jsonl,
    checkpoints to LOG_DIR/checkpoints.jsonl.
    """
    from rich.console import Console

    from tinkertrace.training.config import make_config, parse_key_values
    from tinkertrace.training.errors import TrainingError
    from tinkertrace.training.loop import run_training

    console = Console(stderr=True)
    overrides = {
        "source": source,
        "backend": backend,
        "model": model,
        "epochs": epochs,
        "groups_per_batch": groups_per_batch,
        "learning_rate": learning_rate,
        "lora_rank": lora_rank,
        "loss": loss,
        "advantage": advantage,
        "group_by": group_by,
        "remove_constant_reward_groups": remove_constant_reward_groups,
        "max_tokens_per_datum": max_tokens_per_datum,
        "log_dir": log_dir,
        "save_every": save_every,
        "resume": resume,
        "seed": seed,
        "engine_dir": engine_dir,
        "wandb_project": wandb_project,
    }
    try:
        if loss_config:
            overrides["loss_config"] = parse_key_values(loss_config)
        settings = make_config(config, overrides)
        if follow:
            from tinkertrace.online.follow import FollowOptions

            options = FollowOptions(
                group_size=group_size,
                group_timeout_s=group_timeout,
                max_staleness=max_staleness,
                staleness_mode=staleness_mode,  # type: ignore[arg-type]
                poll_s=poll_seconds,
                max_steps=max_steps,
                idle_timeout_s=idle_timeout,
                publish_url=publish_url,
                publish_token=publish_token or os.environ.get("TINKERTRACE_ADMIN_TOKEN"),
                admission=admission,
            )
            _follow(settings, options, console, progress)
            return
        result = run_training(settings, progress=progress, console=console)
    except TrainingError as exc:
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

    from tinkertrace.online.follow import FollowTrainer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
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
    app.command("train")(train)
