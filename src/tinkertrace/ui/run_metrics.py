"""A run's training metrics (``metrics.jsonl``) as plot series, grouped into the run page's panels."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tinkertrace.training.metrics import read_metrics

# (panel title, unit of its one y axis, pattern of the metric names it plots): a name goes to the first
# panel it matches, so every panel holds one family on one scale (KL never shares an axis with entropy,
# a per-step time with the run's total, seconds with versions). Names no family matches get a panel each.
PANELS: tuple[tuple[str, str, str], ...] = (
    ("reward", "mean reward", r"reward"),
    ("loss", "loss", r"loss"),
    ("KL, sampler vs trainer", "nats", r"^(?!offpolicy/)\S*kl_"),
    ("entropy of the sampled tokens", "nats", r"entropy"),
    ("sampler/trainer mismatch KL on the trained tokens", "nats", r"mismatch_kl"),
    ("tokens truncated (weight cap) and clipped", "share of tokens", r"^offpolicy/(truncated|clipped)_frac"),
    ("importance ratio and clipping", "ratio", r"ratio|clip"),
    ("staleness histogram: trained tokens", "tokens", r"^offpolicy/token_age_\d"),
    ("staleness histogram: trained rollouts", "rollouts", r"^offpolicy/rollout_age_"),
    ("rollouts with several policy versions", "rollouts", r"multi_version"),
    ("waiting for stragglers", "seconds", r"straggler"),
    ("groups: mixed, all good, all bad", "fraction of groups", r"frac_(mixed|all_good|all_bad)"),
    ("rollouts trained and dropped, per step", "rollouts", r"^follow/(rollouts_trained|dropped_stale)$|epis"),
    ("rollouts dropped, run total", "rollouts", r"^follow/.*_total$"),
    ("rollouts waiting", "trajectory rows", r"^follow/"),
    ("staleness", "policy versions", r"^lag/staleness|^offpolicy/token_age_mean"),
    ("lag from rollout end to trained", "seconds", r"^lag/"),
    ("tokens per step", "tokens", r"tokens"),
    ("sequences per step", "sequences", r"^data/"),
    ("time per step", "seconds", r"^time/(?!total)"),
    ("time since the run started", "seconds", r"^time/total"),
    ("learning rate", "learning rate", r"^optim/lr"),
    ("progress: done", "fraction", r"^progress/done_frac"),
    ("progress: batch and epoch", "index", r"^progress/"),
)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def metric_series(log_dirs: list[Path]) -> dict[str, Any]:
    """``{"steps", "panels": [{"title", "unit", "names", "values": [[...], ...]}], "log_dir"}`` from the
    first log folder with metrics (values null where a step did not log the name)."""
    for log_dir in log_dirs:
        records = [r for r in read_metrics(log_dir) if _numeric(r.get("step"))]
        if records:
            break
    else:
        return {"steps": [], "panels": [], "log_dir": None}
    records.sort(key=lambda r: r["step"])
    names = sorted({k for r in records for k, v in r.items() if k != "step" and _numeric(v)})
    taken: set[str] = set()
    panels = []

    def panel(title: str, unit: str, mine: list[str]) -> dict[str, Any]:
        values = [[r.get(n) if _numeric(r.get(n)) else None for r in records] for n in mine]
        return {"title": title, "unit": unit, "names": mine, "values": values}

    for title, unit, pattern in PANELS:
        mine = [n for n in names if n not in taken and re.search(pattern, n)]
        taken.update(mine)
        if mine:
            panels.append(panel(title, unit, mine))
    panels += [panel(n, n, [n]) for n in names if n not in taken]  # every numeric metric, on its own axis
    return {"steps": [r["step"] for r in records], "panels": panels, "log_dir": str(log_dir)}


def version_series(by_version: list[dict[str, Any]]) -> dict[str, Any]:
    """Reward by policy version (:meth:`RunIndex.by_version`'s rows) as one plot panel over the versions:
    the mean and quartiles, or, when the rows are split by environment, each environment's mean
    (``"other"`` for tasks outside the named environments). Rollouts with no policy version (not sampled
    by a published policy) are not plotted: ``unversioned`` counts them."""
    rows = [r for r in by_version if r["policy_version"] is not None]
    versions = sorted({r["policy_version"] for r in rows})
    at = {v: i for i, v in enumerate(versions)}
    split = any(r["environment"] for r in rows)
    if split:
        names = sorted({f"mean {r['environment'] or 'other'}" for r in rows})
        values: list[list[Any]] = [[None] * len(versions) for _ in names]
        for r in rows:
            values[names.index(f"mean {r['environment'] or 'other'}")][at[r["policy_version"]]] = r["mean"]
    else:
        names = ["mean", "q1", "median", "q3"]
        values = [[r[n] for r in sorted(rows, key=lambda r: r["policy_version"])] for n in names]
    return {
        "versions": versions,
        "panels": [{"title": "reward by policy version", "unit": "reward", "names": names, "values": values}],
        "unversioned": sum(r["rollouts"] for r in by_version if r["policy_version"] is None),
        "split": split,
    }
