"""The held-out accuracy, measured through a real local endpoint (built-in model) with the OpenAI client."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tinkertrace.evaluation.evaluate import local_endpoint
from tinkertrace.models.builtin import DEMO_MODEL
from tinkertrace.online.demo_agent import DEMO_TASK
from tinkertrace.online.heldout import heldout_score


def test_heldout_score_judges_every_reply_with_fixed_seeds(tmp_path: Path) -> None:
    with local_endpoint(DEMO_MODEL, base_dir=tmp_path) as url:
        first = heldout_score(url, DEMO_MODEL, DEMO_TASK, max_tokens=8, samples=3)
        again = heldout_score(url, DEMO_MODEL, DEMO_TASK, max_tokens=8, samples=3)
        always = dataclasses.replace(DEMO_TASK, correct=lambda reply, task: bool(reply) or not reply)
        everything = heldout_score(url, DEMO_MODEL, always, max_tokens=8, samples=2)
    assert (first.questions, first.replies, first.policy_version) == (len(DEMO_TASK.heldout), 3 * 2, 0)
    assert first == again  # the same seeds draw the same replies: before and after compare policies
    assert 0.0 <= first.accuracy <= 1.0 and 0.0 <= first.mean_reward <= 1.0
    assert first.accuracy == 0.0  # the untrained built-in model never says exactly "I am tinkertrace."
    assert everything.accuracy == 1.0 and everything.replies == 4
    assert "questions × 3, policy v0" in first.line()


def test_a_task_without_held_out_questions_is_refused() -> None:
    with pytest.raises(ValueError, match="no held-out questions"):
        heldout_score("http://127.0.0.1:9/v1", DEMO_MODEL, dataclasses.replace(DEMO_TASK, heldout=()),
                      max_tokens=8, samples=1)  # fmt: skip
