"""The run page's panels for the off-policy metrics: each family on its own axis."""

from __future__ import annotations

import json
from pathlib import Path

from tinkertrace.ui.run_metrics import metric_series


def test_offpolicy_metrics_get_panels_of_their_own(tmp_path: Path) -> None:
    record = {
        "step": 0,
        **{f"offpolicy/token_age_{a}": 3 for a in ("0", "1", "2", "3", "4+")},
        **{f"offpolicy/rollout_age_{a}": 1 for a in ("0", "1", "2", "3", "4+")},
        "offpolicy/token_age_mean": 0.4,
        "offpolicy/mismatch_kl": 0.01,
        "offpolicy/mismatch_kl_age_0": 0.0,
        "offpolicy/mismatch_kl_age_1": 0.02,
        "offpolicy/ratio_mean": 1.0,
        "offpolicy/ratio_max": 3.0,
        "offpolicy/truncated_frac": 0.1,
        "offpolicy/clipped_frac": 0.2,
        "offpolicy/multi_version_rollouts": 2,
        "offpolicy/straggler_wait_s": 1.5,
        "lag/staleness_mean": 0.5,
        "optim/kl_sample_train_v1": 0.001,
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    panels = {p["title"]: set(p["names"]) for p in metric_series([tmp_path])["panels"]}
    assert panels["staleness histogram: trained tokens"] == {f"offpolicy/token_age_{a}" for a in "0123"} | {
        "offpolicy/token_age_4+"
    }
    assert len(panels["staleness histogram: trained rollouts"]) == 5
    assert panels["sampler/trainer mismatch KL on the trained tokens"] == {
        "offpolicy/mismatch_kl",
        "offpolicy/mismatch_kl_age_0",
        "offpolicy/mismatch_kl_age_1",
    }
    assert panels["KL, sampler vs trainer"] == {"optim/kl_sample_train_v1"}
    assert panels["tokens truncated (weight cap) and clipped"] == {
        "offpolicy/truncated_frac",
        "offpolicy/clipped_frac",
    }
    assert panels["importance ratio and clipping"] == {"offpolicy/ratio_mean", "offpolicy/ratio_max"}
    assert panels["staleness"] == {"lag/staleness_mean", "offpolicy/token_age_mean"}
    assert panels["rollouts with several policy versions"] == {"offpolicy/multi_version_rollouts"}
    assert panels["waiting for stragglers"] == {"offpolicy/straggler_wait_s"}
