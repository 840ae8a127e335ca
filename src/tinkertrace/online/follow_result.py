"""What a follow run did (:class:`FollowResult`), filled in as it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinkertrace.online.lag import LAG_PARTS


@dataclass
class FollowResult:
    """What a follow run did."""

    log_dir: Path
    start_step: int
    steps: int = 0
    rollouts_trained: int = 0
    rollouts_dropped_stale: int = 0
    rollouts_dropped_constant: int = 0
    lags_s: list[float] = field(default_factory=list)
    lag_parts_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in LAG_PARTS})
    rewards: list[float] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    environments: dict[str, dict[str, int]] = field(default_factory=dict)  # per environment: what was built
