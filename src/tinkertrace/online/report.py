"""The end of an online run: a summary (table + ``summary.json``) and a reward-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from tinkertrace.online.follow import FollowResult
from tinkertrace.online.heldout import headline_first
from tinkertrace.training.metrics import read_metrics

REWARD_KEY = "env/all/reward/total"
CURVE_FILE = "reward_curve.png"
SUMMARY_FILE = "summary.json"


def first_last(values: list[float] | np.ndarray, window: int = 3) -> tuple[float, float]:
    """Mean of the first and of the last ``window`` values (``window`` shrinks for short runs)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    w = max(1, min(window, arr.size // 2 or 1))
    return float(arr[:w].mean()), float(arr[-w:].mean())


def summarize(
    log_dir: Path,
    agent_rows: list[dict[str, Any]],
    result: FollowResult,
    *,
    elapsed_s: float,
    served_version: int,
    admission: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's figures, from the metrics file, the follow result and the agents' logs (nothing
    asserted). Every sampled rollout is counted once: trained, dropped (by reason), or still in flight
    at the end (sampled but not yet built or not yet picked for a step)."""
    records = read_metrics(log_dir)
    rewards = [float(r[REWARD_KEY]) for r in records if r.get(REWARD_KEY) is not None]
    first, last = first_last(rewards)
    ok = [r for r in agent_rows if "reward" in r]
    span = (max(r["end"] for r in ok) - min(r["start"] for r in ok)) if ok else 0.0
    tokens = sum(int(r.get("completion_tokens") or 0) for r in ok)
    lag = np.asarray(result.lags_s, dtype=np.float64)
    trained = result.rollouts_trained
    dropped = {"stale": result.rollouts_dropped_stale, "constant_reward": result.rollouts_dropped_constant}
    summary: dict[str, Any] = {
        "steps": len(records),
        "elapsed_s": round(elapsed_s, 1),
        "rollouts_sampled": len(ok),
        "rollouts_failed": len(agent_rows) - len(ok),
        "rollouts_trained": trained,
        "rollouts_dropped": dropped,
        "rollouts_in_flight_at_end": len(ok) - trained - sum(dropped.values()),
        "trained_fraction": trained / len(ok) if ok else None,
        "reward_first": first,
        "reward_last": last,
        "rewards_per_step": rewards,
        "lag_p50_s": float(np.percentile(lag, 50)) if lag.size else None,
        "lag_p95_s": float(np.percentile(lag, 95)) if lag.size else None,
        "lag_parts_p95_s": {
            name: float(np.percentile(v, 95)) if v else None for name, v in result.lag_parts_s.items()
        },
        "step_time_mean_s": float(np.mean([r["time/step"] for r in records])) if records else None,
        "completions_per_s": len(ok) / span if span > 0 else None,
        "tokens_per_s": tokens / span if span > 0 else None,
        "served_policy_version": served_version,
    }
    summary["offpolicy"] = offpolicy_summary(records)
    if admission is not None:
        summary["admission"] = admission
    return summary


AGE_LABELS = ("0", "1", "2", "3", "4+")


def _mean(records: list[dict[str, Any]], name: str) -> float | None:
    values = [float(r[name]) for r in records if r.get(name) is not None]
    return float(np.mean(values)) if values else None


def offpolicy_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's off-policy figures from its steps' ``offpolicy/…`` metrics: staleness histograms
    (summed), mismatch KL (mean and max; by token age: the mean over the steps that trained tokens
    of that age), truncated and clipped shares (means), multi-version
    rollouts and seconds waited for stragglers (summed)."""

    def total(name: str) -> int | float:
        return sum(r.get(name) or 0 for r in records)

    kl = [float(r["offpolicy/mismatch_kl"]) for r in records if r.get("offpolicy/mismatch_kl") is not None]
    return {
        "token_age": {a: int(total(f"offpolicy/token_age_{a}")) for a in AGE_LABELS},
        "rollout_age": {a: int(total(f"offpolicy/rollout_age_{a}")) for a in AGE_LABELS},
        "mismatch_kl_mean": float(np.mean(kl)) if kl else None,
        "mismatch_kl_max": float(np.max(kl)) if kl else None,
        "mismatch_kl_by_age": {a: _mean(records, f"offpolicy/mismatch_kl_age_{a}") for a in AGE_LABELS},
        "truncated_frac_mean": _mean(records, "offpolicy/truncated_frac"),
        "clipped_frac_mean": _mean(records, "offpolicy/clipped_frac"),
        "multi_version_rollouts": int(total("offpolicy/multi_version_rollouts")),
        "straggler_wait_s": round(float(total("offpolicy/straggler_wait_s")), 2),
    }


def _histogram(counts: dict[str, int]) -> str:
    return " ".join(f"{age}:{n}" for age, n in counts.items())


def offpolicy_line(metrics: dict[str, Any]) -> str:
    """One step's off-policy figures, for the live view."""
    tokens = {a: metrics.get(f"offpolicy/token_age_{a}", 0) for a in AGE_LABELS}
    return (
        f"token age (versions) {_histogram(tokens)}  ·  mismatch KL "
        f"{_fmt(metrics.get('offpolicy/mismatch_kl'), '.2g')}  ·  truncated "
        f"{_fmt(metrics.get('offpolicy/truncated_frac'), '.1%')}  ·  clipped "
        f"{_fmt(metrics.get('offpolicy/clipped_frac'), '.1%')}  ·  multi-version rollouts "
        f"{metrics.get('offpolicy/multi_version_rollouts', 0)}  ·  straggler wait "
        f"{_fmt(metrics.get('offpolicy/straggler_wait_s'), '.1f')}s"
    )


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def summary_table(summary: dict[str, Any]) -> Table:
    """A two-column rich table of the summary."""
    table = Table(title="tinkertrace demo — summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("training steps", _fmt(summary["steps"])),
        ("wall time", f"{summary['elapsed_s']:.0f} s"),
        ("rollouts sampled / trained", f"{summary['rollouts_sampled']} / {summary['rollouts_trained']}"),
        (
            "rollouts dropped (stale / constant reward)",
            f"{summary['rollouts_dropped']['stale']} / {summary['rollouts_dropped']['constant_reward']}",
        ),
        ("rollouts in flight at the end", _fmt(summary["rollouts_in_flight_at_end"])),
        (
            "reward, first steps → last steps",
            f"{_fmt(summary['reward_first'])} → {_fmt(summary['reward_last'])}",
        ),
        (
            "lag rollout end → trained, p50 / p95",
            f"{_fmt(summary['lag_p50_s'], '.1f')} s / {_fmt(summary['lag_p95_s'], '.1f')} s",
        ),
        (
            "endpoint completions/s, tokens/s",
            f"{_fmt(summary['completions_per_s'], '.1f')}, {_fmt(summary['tokens_per_s'], '.0f')}",
        ),
        *_heldout_rows(summary.get("heldout")),
        ("policy version served at the end", _fmt(summary["served_policy_version"])),
        ("step time, mean", f"{_fmt(summary['step_time_mean_s'], '.2f')} s"),
    ]
    off = summary.get("offpolicy")
    if off:
        rows += [
            ("trained tokens by age in versions", _histogram(off["token_age"])),
            ("trained rollouts by age (oldest token)", _histogram(off["rollout_age"])),
            (
                "sampler/trainer mismatch KL, mean / max",
                f"{_fmt(off['mismatch_kl_mean'], '.2g')} / {_fmt(off['mismatch_kl_max'], '.2g')}",
            ),
            (
                "tokens truncated / clipped, mean share",
                f"{_fmt(off['truncated_frac_mean'], '.1%')} / {_fmt(off['clipped_frac_mean'], '.1%')}",
            ),
            ("rollouts with several policy versions", _fmt(off["multi_version_rollouts"])),
            ("trainer waiting for stragglers", f"{off['straggler_wait_s']:.1f} s"),
        ]
    gate = summary.get("admission")
    if gate and gate.get("capacity"):
        rows.append(
            (
                "endpoint admission: admitted / held, wait p95",
                f"{gate['admitted']} / {gate['held']}, {_fmt(gate['wait_p95_s'], '.2f')} s",
            )
        )
    for label, value in rows:
        table.add_row(label, value)
    return table


def _heldout_rows(heldout: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The held-out accuracy and mean reward, before → after training, the task's headline first."""
    if not heldout:
        return []
    b, a = heldout["before"], heldout["after"]
    return list(
        headline_first(
            heldout["headline"],
            ("held-out accuracy, before → after", f"{b['accuracy']:.3f} → {a['accuracy']:.3f}"),
            ("held-out mean reward, before → after", f"{b['mean_reward']:.3f} → {a['mean_reward']:.3f}"),
        )
    )


def plot_rewards(rewards: list[float], path: Path, title: str = "reward per training step") -> Path:
    """Save a PNG of the per-step reward and its moving average."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = np.arange(1, len(rewards) + 1)
    ax.plot(steps, rewards, marker="o", markersize=3, linewidth=1, alpha=0.6, label="batch mean reward")
    if len(rewards) >= 5:
        k = 5
        smooth = np.convolve(rewards, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1 :], smooth, linewidth=2.5, label=f"moving average ({k} steps)")
    ax.set_xlabel("training step (policy version after it)")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(out: Path, summary: dict[str, Any]) -> tuple[Path, Path]:
    """``summary.json`` and the reward-curve PNG in ``out``."""
    summary_path = out / SUMMARY_FILE
    summary_path.write_text(json.dumps(summary, indent=2))
    curve = plot_rewards(summary["rewards_per_step"], out / CURVE_FILE)
    return summary_path, curve
