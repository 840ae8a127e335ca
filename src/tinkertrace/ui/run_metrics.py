"""A run's training metrics (``metrics.jsonl``) as plot series, grouped into the run page's panels."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tinkertrace.training.metrics import read_metrics

# (panel title, pattern of the metric names it plots); a name goes to the first panel it matches.
PANELS: tuple[tuple[str, str], ...] = (
    ("reward", r"reward"),
    ("loss", r"loss"),
    ("sampler vs trainer (KL, ratio, entropy)", r"kl_|ratio|entropy|clip"),
    ("groups: mixed, all good, all bad", r"frac"),
    ("rollouts trained and dropped", r"^follow/|episodes"),
    ("lag and staleness", r"^lag/"),
    ("data", r"^data/|tokens"),
    ("time", r"^time/"),
    ("other", r""),  # every numeric metric is plotted somewhere
)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def metric_series(log_dirs: list[Path]) -> dict[str, Any]:
    """``{"steps": [...], "panels": [{"title", "names", "values": [[...], ...]}], "log_dir"}`` from the
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
    for title, pattern in PANELS:
        mine = [n for n in names if n not in taken and re.search(pattern, n)]
        taken.update(mine)
        if mine:
            panels.append(
                {
                    "title": title,
                    "names": mine,
                    "values": [[r.get(n) if _numeric(r.get(n)) else None for r in records] for n in mine],
                }
            )
    return {"steps": [r["step"] for r in records], "panels": panels, "log_dir": str(log_dir)}
