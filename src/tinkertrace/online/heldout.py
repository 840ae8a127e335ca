"""Held-out accuracy and reward: how the served policy answers demo questions training never asks.

The demo measures it on the endpoint before the first step and after the last one. Every held-out
question is asked ``samples`` times, the way the agents ask (temperature 1, the task's reply length),
with seeds fixed per question and sample, so "before" and "after" draw the same random numbers and
their difference is the policy's, not the dice's. The calls carry no rollout id: they are not
traced, never trained, and the endpoint's admission gate lets them through. Each task names its
headline figure: the addition task's accuracy; the identity task's mean reward, since its 60 steps
from random weights learn the target's characters but no reply exactly right.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np
from openai import OpenAI

from tinkertrace.online.demo_agent import DemoTask, Headline, ask

T = TypeVar("T")
SEED_BASE = 1_000_003  # held-out sampling seeds: SEED_BASE × question + sample


@dataclass(frozen=True)
class HeldoutScore:
    """One measurement: accuracy (share of replies judged correct), mean reward, what was asked, the
    task's ``headline`` figure (:class:`DemoTask`) and each question's first reply."""

    accuracy: float
    mean_reward: float
    questions: int
    replies: int
    policy_version: int | None
    headline: Headline = "accuracy"
    examples: tuple[tuple[str, str], ...] = ()  # (question, its first reply)

    def line(self) -> str:
        """``mean reward 0.362 (accuracy 0.00, 2 questions × 8, policy v60); e.g. 'Q?' → 'reply'``,
        the headline figure first (replies quoted as Python literals: control characters escaped)."""
        first, second = headline_first(
            self.headline, f"accuracy {self.accuracy:.2f}", f"mean reward {self.mean_reward:.3f}"
        )
        example = f"; e.g. {self.examples[0][0]!r} → {self.examples[0][1]!r}" if self.examples else ""
        return (
            f"{first} ({second}, {self.questions} questions × {self.replies // max(self.questions, 1)}, "
            f"policy v{self.policy_version}){example}"
        )


def headline_first(headline: Headline, accuracy: T, mean_reward: T) -> tuple[T, T]:
    """The accuracy's and the mean reward's item, the task's headline figure first."""
    return (mean_reward, accuracy) if headline == "mean_reward" else (accuracy, mean_reward)


def heldout_summary(task: DemoTask, before: HeldoutScore, after: HeldoutScore) -> dict[str, Any]:
    """``summary.json``'s ``heldout``: which figure is the headline, what the accuracy counts, and
    both measurements."""
    return {
        "headline": task.headline,
        "correct": task.correct_means,
        "before": asdict(before),
        "after": asdict(after),
    }


def heldout_verdict(heldout: dict[str, Any]) -> str:
    """``held-out mean reward 0.024 → 0.362 (+0.338); accuracy (exactly 'I am tinkertrace.') 0.000 →
    0.000``: the headline figure's change, then the other's."""
    b, a = heldout["before"], heldout["after"]
    names = {"accuracy": f"accuracy ({heldout['correct']})", "mean_reward": "mean reward"}
    first, second = headline_first(heldout["headline"], "accuracy", "mean_reward")

    def change(key: str) -> str:
        return f"{names[key]} {b[key]:.3f} → {a[key]:.3f}"

    return f"held-out {change(first)} ({a[first] - b[first]:+.3f}); {change(second)}"


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
        headline=task.headline,
        examples=tuple((t["question"], answers[q * samples][0]) for q, t in enumerate(task.heldout)),
    )
