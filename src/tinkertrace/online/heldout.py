"""Held-out accuracy: how the served policy answers a demo task's questions that training never asks.

The demo measures it on the endpoint before the first step and after the last one. Every held-out
question is asked ``samples`` times, the way the agents ask (temperature 1, the task's reply length),
with seeds fixed per question and sample, so "before" and "after" draw the same random numbers and
their difference is the policy's, not the dice's. The calls carry no rollout id: they are not
traced, never trained, and the endpoint's admission gate lets them through.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from openai import OpenAI

from tinkertrace.online.demo_agent import DemoTask, ask

SEED_BASE = 1_000_003  # held-out sampling seeds: SEED_BASE × question + sample


@dataclass(frozen=True)
class HeldoutScore:
    """One measurement: accuracy (share of replies judged correct), mean reward, and what was asked."""

    accuracy: float
    mean_reward: float
    questions: int
    replies: int
    policy_version: int | None

    def line(self) -> str:
        """``accuracy 0.62 (mean reward 0.41, 16 questions × 8, policy v12)``."""
        return (
            f"accuracy {self.accuracy:.2f} (mean reward {self.mean_reward:.3f}, {self.questions} questions × "
            f"{self.replies // max(self.questions, 1)}, policy v{self.policy_version})"
        )


def heldout_score(
    base_url: str, model: str, task: DemoTask, *, max_tokens: int, samples: int
) -> HeldoutScore:
    """Ask each of ``task.heldout`` ``samples`` times through the endpoint at ``base_url``; judge the
    replies with the task's ``correct`` and ``reward``. ValueError for a task without held-out
    questions or judges."""
    if not task.heldout or task.correct is None or task.reward is None:
        raise ValueError("this demo task has no held-out questions to measure accuracy on")
    client = OpenAI(base_url=base_url, api_key="EMPTY", max_retries=3, timeout=600)
    jobs = [(q, s) for q in range(len(task.heldout)) for s in range(samples)]

    def one(job: tuple[int, int]) -> tuple[str, Any]:
        q, s = job
        reply, _, version = ask(client, model, task.heldout[q]["question"], max_tokens, SEED_BASE * q + s)
        return reply, version

    with ThreadPoolExecutor(min(32, len(jobs))) as pool:
        answers = list(pool.map(one, jobs))
    asked = [task.heldout[q] for q, _ in jobs]
    correct = np.array([task.correct(reply, t) for (reply, _), t in zip(answers, asked, strict=True)])
    rewards = np.array([task.reward(reply, t) for (reply, _), t in zip(answers, asked, strict=True)])
    versions = {version for _, version in answers}
    return HeldoutScore(
        accuracy=float(correct.mean()),
        mean_reward=float(rewards.mean()),
        questions=len(task.heldout),
        replies=len(jobs),
        policy_version=versions.pop() if len(versions) == 1 else None,
    )
