"""The demo's tasks: the addition task's reward and rounds, and each task's settings by model."""

from __future__ import annotations

import pytest

from tinkertrace.online import addition_agent, demo_agent
from tinkertrace.online.addition_agent import HELDOUT_PAIRS, addition_reward, addition_task
from tinkertrace.online.demo_agent import QUESTIONS, identity_task
from tinkertrace.online.settings import DEMO_TASKS, DemoSettings
from tinkertrace.settings import ConfigError


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ("19", 1.0),
        (" 19.\n", 1.0),
        ("The answer is 19.", 0.5),
        ("12 + 7 = 19", 0.5),
        ("119", 0.1),  # a bare wrong number: the format only
        ("20", 0.1),
        ("To find 12 + 7,", 0.0),
        ("", 0.0),
    ],
)
def test_addition_reward_pays_the_sum_alone_most(reply: str, reward: float) -> None:
    assert addition_reward(reply, 19) == reward


def test_addition_rounds_share_a_sum_per_group_and_differ_across_rounds() -> None:
    task = addition_task(0, 3)
    assert task == addition_task(0, 3)  # a round's rollouts (one group) ask the same sum
    a, b = (int(n) for n in task["question"].removeprefix("What is ").split("?")[0].split(" + "))
    assert task["answer"] == a + b and task["id"].startswith(f"add-{a}-{b}-w0-r3")
    sums = {addition_task(w, r)["question"] for w in range(2) for r in range(10)}
    assert len(sums) > 10  # rounds and workers draw different sums
    assert len({addition_task(w, r)["id"] for w in range(2) for r in range(10)}) == 20


def test_training_never_asks_a_held_out_question() -> None:
    drawn = {
        tuple(int(n) for n in addition_task(w, r, seed)["question"][8:].split("?")[0].split(" + "))
        for seed in range(3)
        for w in range(4)
        for r in range(200)
    }
    assert len(HELDOUT_PAIRS) == 16 and not drawn & set(HELDOUT_PAIRS)
    assert len(drawn) == 81 - 16  # every other sum is drawn
    assert addition_task(0, 3, seed=1) != addition_task(0, 3, seed=2)  # the seed changes the draws
    held = addition_agent.DEMO_TASK.heldout
    assert {t["question"] for t in held} == {
        f"What is {a} + {b}? Reply with only the number." for a, b in HELDOUT_PAIRS
    }
    assert {t["question"] for t in demo_agent.DEMO_TASK.heldout}.isdisjoint(QUESTIONS)


@pytest.mark.parametrize(
    ("reply", "correct"), [("12", True), ("7 + 5 = 12.", True), ("13", False), ("Seven plus five.", False)]
)
def test_a_held_out_sum_is_right_when_the_reply_states_it(reply: str, correct: bool) -> None:
    task = addition_agent.sum_task(7, 5, "t")
    assert (
        addition_agent.DEMO_TASK.correct is not None
        and addition_agent.DEMO_TASK.correct(reply, task) is correct
    )


# replies the demo's policy gave to "Tell me who you are." (held out) before and after its 60 steps
UNTRAINED = "k\ufffd\ufffdl\ufffd\ufffdf\ufffd[(\ufffd\ufffd\u0251\ufffd\x06k\x12s_"
TRAINED = ("atkk   amkea cnerciI", " erIrrcaraam t r eca", "kmtaartcIkanri\ufffdaak  ")


def test_identity_judges_give_the_trained_replies_partial_credit_and_only_the_target_is_right() -> None:
    reward, correct = demo_agent.DEMO_TASK.reward, demo_agent.DEMO_TASK.correct
    assert reward is not None and correct is not None
    before = reward(UNTRAINED, {})
    after = [reward(reply, {}) for reply in TRAINED]
    assert before < 0.1 < 0.25 < min(after) and max(after) < 0.5  # right letters, wrong order
    assert not any(correct(reply, {}) for reply in (UNTRAINED, *TRAINED))
    assert correct(" I am tinkertrace.\n", {}) and reward(" I am tinkertrace.\n", {}) == 1.0
    assert not correct("I am tinkertrace", {}) and 0.9 < reward("I am tinkertrace", {}) < 1.0
    # where no reply is exactly right in a demo's steps, the partial-credit reward is the headline
    assert demo_agent.DEMO_TASK.headline == "mean_reward" and addition_agent.DEMO_TASK.headline == "accuracy"


def test_each_model_gets_its_task_and_the_tasks_settings(tmp_path) -> None:
    builtin = DemoSettings(out=tmp_path).validate()
    assert (builtin.task, builtin.preset.agent_module) == ("identity", "tinkertrace.online.demo_agent")
    assert (builtin.steps, builtin.learning_rate) == (DEMO_TASKS["identity"].steps, 3e-3)
    assert identity_task(1, 0)["question"] != identity_task(0, 0)["question"]
    real = DemoSettings(out=tmp_path, model="smollm2-135m-instruct").validate()
    preset = DEMO_TASKS["addition"]
    assert (real.task, real.preset.agent_module) == ("addition", "tinkertrace.online.addition_agent")
    assert (real.steps, real.max_seconds, real.learning_rate, real.max_tokens) == (
        preset.steps, preset.max_seconds, preset.learning_rate, preset.max_tokens,
    )  # fmt: skip
    chosen = DemoSettings(out=tmp_path, model="smollm2-135m-instruct", task="identity", steps=3).validate()
    assert (chosen.task, chosen.steps, chosen.learning_rate) == ("identity", 3, 3e-3)


def test_a_bad_task_is_named(tmp_path) -> None:
    with pytest.raises(ConfigError, match="task must be one of identity, addition"):
        DemoSettings(out=tmp_path, task="poetry").validate()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_substeps must be at least 1"):
        DemoSettings(out=tmp_path, num_substeps=0).validate()
