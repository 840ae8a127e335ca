"""`tinkertrace demo`: the whole online loop on this machine, no keys, no network.

Starts the collector and the sampling endpoint (local engine), runs the task's agents (identity,
:mod:`tinkertrace.online.demo_agent`, on the built-in model; addition,
:mod:`tinkertrace.online.addition_agent`, on a pretrained one) in several worker processes,
trains in follow mode with each new policy swapped into the endpoint, shows the reward live, and
ends with a summary table, ``summary.json`` and ``reward_curve.png`` in the output folder.
"""

from __future__ import annotations

import time
from importlib import import_module
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from tinkertrace.online.demo_agent import DemoTask
from tinkertrace.online.follow import FollowTrainer
from tinkertrace.online.heldout import HeldoutScore, heldout_score, heldout_summary, heldout_verdict
from tinkertrace.online.publish import holder_publisher
from tinkertrace.online.report import (
    REWARD_KEY,
    first_last,
    offpolicy_line,
    summarize,
    summary_table,
    write_report,
)
from tinkertrace.online.runner import OnlineStack
from tinkertrace.online.settings import DemoSettings, FollowSettings, StackSettings
from tinkertrace.training.config import TrainSettings

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """Unicode sparkline of ``values`` (last 60)."""
    if not values:
        return ""
    arr = np.asarray(values[-60:], dtype=np.float64)
    lo, hi = float(arr.min()), float(arr.max())
    scaled = np.zeros_like(arr) if hi - lo < 1e-12 else (arr - lo) / (hi - lo)
    return "".join(SPARK[round(v * (len(SPARK) - 1))] for v in scaled)


class _Display:
    """The live view: step, reward now vs first, sparkline, lag and endpoint state."""

    def __init__(self, stack: OnlineStack, settings: DemoSettings) -> None:
        self.stack, self.settings = stack, settings
        self.rewards: list[float] = []
        self.last: dict[str, Any] = {}
        self.started = time.monotonic()

    def on_step(self, step: int, metrics: dict[str, Any]) -> None:
        self.rewards.append(float(metrics[REWARD_KEY]))
        self.last = metrics

    def __rich__(self) -> Group:
        s, m = self.settings, self.last
        first, now = first_last(self.rewards)
        head = Text.assemble(
            ("tinkertrace demo ", "bold magenta"),
            f"step {len(self.rewards)}/{s.steps}  ·  {time.monotonic() - self.started:.0f}s  ·  "
            f"{s.workers} agent workers  ·  endpoint serves policy v{self.stack.holder.version}",
        )
        if not self.rewards:
            return Group(head, Text("waiting for the first groups of rollouts…", style="dim"))
        lines = [
            head,
            Text.assemble(
                ("reward ", "bold"),
                f"{now:.3f} (first steps {first:.3f})  ",
                (sparkline(self.rewards), "green"),
            ),
            Text(
                f"lag rollout→trained p50 {m.get('lag/rollout_to_trained_p50_s', float('nan')):.1f}s "
                f"p95 {m.get('lag/rollout_to_trained_p95_s', float('nan')):.1f}s  ·  staleness max "
                f"{m.get('lag/staleness_max', 0)}  ·  dropped stale {m.get('follow/dropped_stale_total', 0)}",
                style="dim",
            ),
            Text(offpolicy_line(m), style="dim"),
            Text(_admission_line(self.stack.holder.admission.stats()), style="dim"),
        ]
        return Group(*lines)


def _admission_line(gate: dict[str, Any]) -> str:
    if not gate["enabled"]:
        return "endpoint admission: off (every new rollout starts at once)"  # not stated, or withdrawn
    return (
        f"endpoint admission: {gate['open']}/{gate['capacity']} rollouts started and not yet trained  ·  "
        f"{gate['held']} of {gate['admitted']} waited, p95 {gate['wait_p95_s']:.2f}s"
    )


def run_demo(
    settings: DemoSettings,
    console: Console | None = None,
    configs: tuple[StackSettings, TrainSettings, FollowSettings] | None = None,
) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``settings.out``). ``configs``: the stack,
    training and follow settings to run instead of :func:`demo_configs`'s (a benchmark's arms)."""
    console = console or Console()
    settings.out.mkdir(parents=True, exist_ok=True)
    stack_settings, config, options = configs or demo_configs(settings)
    started = time.monotonic()
    console.print(
        f"[bold]tinkertrace demo[/] → {settings.out}  (model {settings.model}, task {settings.task}: "
        f"{settings.preset.goal})",
        highlight=False,
    )
    task: DemoTask = import_module(settings.preset.agent_module).DEMO_TASK
    with OnlineStack(stack_settings) as stack:
        console.print(f"collector {stack.collector_url}  ·  endpoint {stack.base_url}", highlight=False)
        before = _heldout(stack, settings, task, console, "before training")
        result = _train_live(stack, settings, config, options, console)
        served, admission = stack.holder.version, stack.holder.admission.stats()
        agent_rows = stack.agent_results()
        after = _heldout(stack, settings, task, console, "after training")
    elapsed = time.monotonic() - started
    summary = summarize(
        config.log_dir, agent_rows, result, elapsed_s=elapsed, served_version=served, admission=admission
    )
    summary["out"] = str(settings.out)
    if before is not None and after is not None:
        summary["heldout"] = heldout_summary(task, before, after)
    _report(console, summary, config.log_dir)
    return summary


def _heldout(
    stack: OnlineStack, settings: DemoSettings, task: DemoTask, console: Console, when: str
) -> HeldoutScore | None:
    """The served policy's held-out score (None when ``heldout_samples`` is 0)."""
    if settings.heldout_samples == 0:
        return None
    with console.status(f"held-out questions {when}…"):
        score = heldout_score(
            stack.base_url,
            settings.model,
            task,
            max_tokens=settings.max_tokens or settings.preset.max_tokens,
            samples=settings.heldout_samples,
        )
    console.print(f"held-out {when}: {score.line()}", highlight=False, markup=False)
    return score


def demo_configs(settings: DemoSettings) -> tuple[StackSettings, TrainSettings, FollowSettings]:
    """The stack, training and follow settings of a demo run."""
    s = settings
    stack = StackSettings(
        out=s.out,
        model=s.model,
        group_size=s.group_size,
        max_tokens=s.max_tokens or s.preset.max_tokens,
        agent_module=s.preset.agent_module,
        roll_seconds=s.roll_seconds,
        export_delay_s=s.export_delay_s,
        inflight=s.inflight,
        worker_args=("--seed", str(s.seed)),
    )
    config = TrainSettings(
        source=stack.spans_dir,
        model=s.model,
        learning_rate=s.learning_rate or s.preset.learning_rate,
        num_substeps=s.num_substeps,
        lora_rank=s.lora_rank,
        loss=s.loss,
        groups_per_batch=s.groups_per_batch,
        log_dir=s.out / "train",
        engine_dir=stack.engine_dir,
        seed=s.seed,
    )
    options = FollowSettings(
        group_size=s.group_size,
        group_timeout_s=10.0,
        max_staleness=s.max_staleness,
        staleness_mode=s.staleness_mode,
        sync=s.sync,
        poll_s=0.25,
        max_steps=s.steps,
        admission=s.admission,
    )
    return stack, config, options


def _train_live(
    stack: OnlineStack,
    settings: DemoSettings,
    config: TrainSettings,
    options: FollowSettings,
    console: Console,
) -> Any:
    """Follow-train on the agents' rollouts, publishing into the stack's endpoint, under a live view."""
    display = _Display(stack, settings)
    trainer = FollowTrainer(
        config,
        options,
        publish=holder_publisher(stack.holder),
        service=stack.service,
        on_step=display.on_step,
    )
    live = Live(display, console=console, refresh_per_second=4, transient=False)
    try:
        return stack.run_trainer(
            trainer,
            workers=settings.workers,
            max_seconds=settings.max_seconds or settings.preset.max_seconds,
            around=live,
        )
    finally:
        if not console.is_terminal:  # Rich leaves a file's last live line unended: end it
            console.line()


def _report(console: Console, summary: dict[str, Any], log_dir: Path) -> None:
    """Write summary.json and the reward curve; print the table and the verdict."""
    summary_path, curve = write_report(Path(summary["out"]), summary)
    console.print(summary_table(summary))
    first, last = summary["reward_first"], summary["reward_last"]
    if summary["steps"] == 0:
        verdict = "no training step ran (see the logs in the output folder)"
    elif last > first:
        verdict = f"reward rose from {first:.3f} to {last:.3f} (+{last - first:.3f})"
    else:
        verdict = f"reward did not rise: {first:.3f} → {last:.3f}"
    console.print(
        f"[bold]{verdict}[/] (mean of the first vs the last training steps, measured)", highlight=False
    )
    if "heldout" in summary:
        console.print(
            Text(heldout_verdict(summary["heldout"]), style="bold"),
            "(questions training never asked, before the first step and after the last)",
            highlight=False,
        )
    console.print(
        f"reward curve: {curve}\nsummary: {summary_path}\nmetrics: {log_dir / 'metrics.jsonl'}",
        highlight=False,
    )
