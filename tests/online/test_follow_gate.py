"""Follow mode and the endpoint's admission gate (a real in-process endpoint, its own spans folder):
rollouts the trainer drops between steps free their places at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinkertrace.online.follow import FollowTrainer
from tinkertrace.online.publish import HolderPublisher
from tinkertrace.online.runner import OnlineStack
from tinkertrace.online.settings import FollowSettings
from tinkertrace.training.config import TrainSettings

from .conftest import MODEL, make_rollouts

pytestmark = pytest.mark.slow


def test_a_batch_of_constant_reward_groups_frees_its_places_at_the_gate(
    stack: OnlineStack, tmp_path: Path
) -> None:
    """Every group of the batch got one reward, so no step trains and nothing is published. The gate
    must still hear that those rollouts are done: full of them, it would hold every rollout the next
    step needs while the trainer waits for them (a SmolLM2 demo stalled so until its time ran out)."""
    gate = stack.holder.admission
    make_rollouts(stack, "constant", groups=2, rewards=[1.0] * 4)
    assert gate.stats()["open"] == 8
    config = TrainSettings(
        source=stack.settings.spans_dir, model=MODEL, groups_per_batch=2, log_dir=tmp_path / "train",
        engine_dir=stack.settings.engine_dir,
    )  # fmt: skip
    options = FollowSettings(group_size=4, poll_s=0.2, max_steps=1, idle_timeout_s=3)
    result = FollowTrainer(config, options, publish=HolderPublisher(stack.holder)).run(progress=False)
    assert (result.steps, result.rollouts_dropped_constant) == (0, 8)
    stats = gate.stats()
    assert (stats["consumed"], stats["open"]) == (8, 0)
