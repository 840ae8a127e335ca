"""The held-out score, measured through a real local endpoint (built-in model) with the OpenAI client."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.evaluation.evaluate import local_endpoint
from tinkertrace.models.builtin import DEMO_MODEL
from tinkertrace.models.tokenizer import load_tokenizer
from tinkertrace.online import addition_agent
from tinkertrace.online.demo_agent import DEMO_TASK, QUESTIONS, TARGET
from tinkertrace.online.heldout import heldout_score, heldout_summary, heldout_verdict
from tinkertrace.online.runner import serve_policy

NANO = "tinkertrace/tiny-chat:nano"


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
    # each held-out question with its first reply, judged like the rest
    assert [q for q, _ in first.examples] == [t["question"] for t in DEMO_TASK.heldout]
    assert all(DEMO_TASK.reward(reply, {}) <= 0.2 for _, reply in first.examples)  # type: ignore[misc]
    # the identity task's headline is its mean reward, named first
    assert first.headline == "mean_reward" and first.line().startswith(
        f"mean reward {first.mean_reward:.3f} ("
    )
    assert "questions × 3, policy v0); e.g. 'Tell me who you are.' → " in first.line()


def sft_datum(tokenizer: object, question: str) -> types.Datum:
    """``question`` answered with the identity target, the reply's tokens weighted."""
    prompt = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer.encode(prompt)  # type: ignore[attr-defined]
    ids = tokenizer.encode(prompt + TARGET + "<|im_end|>")  # type: ignore[attr-defined]
    weights = [0.0] * (len(prompt_ids) - 1) + [1.0] * (len(ids) - len(prompt_ids))
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
    )


def test_the_identity_headline_rises_on_a_policy_trained_on_the_training_questions_only(
    tmp_path: Path,
) -> None:
    """Fine-tuned to answer the four training questions (a couple of seconds on the nano model), the
    policy answers the two held-out phrasings better too: the headline figure moves, and the
    summary puts it first."""
    service = ServiceClient(base_dir=tmp_path / "engine", cpu_threads=1)
    trainer = service.create_lora_training_client(NANO, rank=8, seed=0)
    data = [sft_datum(load_tokenizer(NANO), q) for q in QUESTIONS]
    for _ in range(100):
        trainer.forward_backward(data, "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    path = trainer.save_weights_for_sampler("identity").result().path
    holder, server = serve_policy(service, NANO, 20)
    try:
        url = server.url + "/v1"
        before = heldout_score(url, NANO, DEMO_TASK, max_tokens=20, samples=4)
        holder.load(path, 1)
        after = heldout_score(url, NANO, DEMO_TASK, max_tokens=20, samples=4)
    finally:
        server.stop()
        holder.close()
    assert (before.policy_version, after.policy_version) == (0, 1)
    assert after.mean_reward > before.mean_reward + 0.2
    assert after.accuracy > before.accuracy == 0.0  # and some replies are now exactly right
    heldout = heldout_summary(DEMO_TASK, before, after)
    assert (
        heldout["headline"] == "mean_reward" and heldout["after"]["examples"][0][0] == "Tell me who you are."
    )
    verdict = heldout_verdict(heldout)
    assert verdict.startswith(f"held-out mean reward {before.mean_reward:.3f} → {after.mean_reward:.3f} (+")
    assert f"accuracy (exactly 'I am tinkertrace.') 0.000 → {after.accuracy:.3f}" in verdict
    # the addition task keeps its accuracy as the headline
    added = heldout_summary(addition_agent.DEMO_TASK, before, after)
    assert heldout_verdict(added).startswith("held-out accuracy (states the sum) 0.000 → ")


def test_a_task_without_held_out_questions_is_refused() -> None:
    with pytest.raises(ValueError, match="no held-out questions"):
        heldout_score("http://127.0.0.1:9/v1", DEMO_MODEL, dataclasses.replace(DEMO_TASK, heldout=()),
                      max_tokens=8, samples=1)  # fmt: skip
