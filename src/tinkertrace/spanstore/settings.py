"""Settings of ``tinkertrace spans compact``, each declared once (the command makes its options from
them). Light on purpose: the command line imports it to build its help."""

from __future__ import annotations

from dataclasses import dataclass

from tinkertrace.settings import raise_problems, setting
from tinkertrace.spanstore import ZSTD_LEVEL, ZSTD_LEVELS


@dataclass(frozen=True)
class CompactSettings:
    """Which files of a spans folder compaction merges, and how the merged files are written."""

    small_mb: float = setting(64.0, "Merge files smaller than this, MiB.")
    target_mb: float = setting(256.0, "Aim for merged files of about this size, MiB.")
    grace_seconds: float = setting(300.0, "Only touch partitions whose hour ended at least this long ago.")
    zstd_level: int = setting(
        ZSTD_LEVEL,
        "zstd level of the merged files (the collector writes level 1; higher levels, e.g. 3 to 9, store "
        "closed hours smaller for more CPU once).",
    )

    def validate(self) -> CompactSettings:
        """Check ranges; returns self."""
        low, high = ZSTD_LEVELS
        checks = [
            (self.small_mb > 0, "small_mb must be positive"),
            (self.target_mb > 0, "target_mb must be positive"),
            (self.grace_seconds >= 0, "grace_seconds must be 0 or more"),
            (low <= self.zstd_level <= high, f"zstd_level must be in {low}..{high}"),
        ]
        raise_problems(checks, "invalid compact settings")
        return self
