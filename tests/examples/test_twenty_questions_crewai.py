"""examples/twenty_questions/crew.py: the CrewAI flow, run in its own environment (.venv-crewai, built by
``make crewai-env``), against the real sampling endpoint.

The first test scripts the model (a hosted-Tinker double behind the real endpoint) so the flow's whole
tool loop runs: CrewAI sends the tools, the endpoint's tool parser turns the model's ``<tool_call>``
into a structured call, CrewAI runs the tool and sends its result back as a ``tool`` message. The spans
carry exactly the sampled token ids and build into one trajectory per game. The second (slow) trains a
step of SmolLM2-135M-Instruct with the example's config, through the runner and its collector.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tinkertrace.builder import build_trajectories
from tinkertrace.evaluation.rollouts import load_ref
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.environments import require_built
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler

ROOT = Path(__file__).resolve().parents[2]
CREWAI_PYTHON = ROOT / ".venv-crewai" / "bin" / "python"
require_built(CREWAI_PYTHON.exists(), "the CrewAI example's environment (.venv-crewai)", "crewai-env")

PLAY = """
import json, sys
import tinkertrace
from examples.twenty_questions.crew import play
tinkertrace.init(**json.loads(sys.argv[1]))
games = json.loads(sys.argv[3])
results = [play(task, base_url=sys.argv[2], model=sys.argv[4], **kwargs) for task, kwargs in games]
tinkertrace.flush()
print(json.dumps(results))
"""


def _play(init: dict, url: str, games: list, model: str, timeout: float) -> list[dict]:
    args = [json.dumps(init), url, json.dumps(games), model]
    proc = subprocess.run(
        [str(CREWAI_PYTHON), "-c", PLAY, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def test_flow_plays_with_structured_tool_calls_and_leaves_the_sampled_ids(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(BUILTIN_MODEL)
    replies: list[str] = []

    def model(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        if "at most 2." in prompt:  # asks the same thing until out of questions
            reply = _call("ask", {"question": "Is it red?"})
        elif prompt.endswith('"arguments": '):  # tool_choice "ask": the endpoint opened the call
            reply = '{"question": "Is it a cat?"}}\n</tool_call>'
        elif "a fruit" in prompt:
            reply = _call("guess", {"noun": "banana"})
        elif "<tool_response>" not in prompt:
            reply = _call("ask", {"question": "Is it a dog?"})
        else:
            reply = _call("ask", {"question": "Is it a cat?"})
        replies.append(reply)
        return reply

    sampler = ScriptedTinkerSampler(model)
    cat = {"category": "animal", "answer": "cat"}
    auto = {"tool_choice": "auto", "max_tokens": 128}  # the built-in model's tokens are bytes
    games = [
        ({**cat, "id": "20q-ask"}, auto),  # asks twice, finds it
        ({"id": "20q-guess", "category": "fruit", "answer": "apple"}, auto),  # guesses wrong
        ({**cat, "id": "20q-forced"}, {"max_tokens": 128}),  # the default: every turn a call of ask
        ({**cat, "id": "20q-limit"}, {**auto, "max_questions": 2}),  # the second question ends the game
    ]
    with BackgroundServer(create_app(PolicyHolder(sampler, tokenizer, "test-model"))) as endpoint:
        spans = tmp_path / "spans"
        results = _play({"spans_dir": str(spans)}, endpoint.url + "/v1", games, "test-model", 180)
    agent = ROOT / "examples" / "twenty_questions" / "agent.py"
    score, nouns = load_ref(f"{agent}:score"), load_ref(f"{agent}:nouns")
    wrong_guess = score(["Is it a banana?"], "apple", found=False, listed=nouns("fruit"))  # a listed noun
    red = score(["Is it red?"] * 2, "cat", found=False, listed=nouns("animal"))
    assert score(["Is it a banana?"], "apple", found=False) < wrong_guess < 1.0 and 0.0 < red < wrong_guess
    assert [(r["reward"], r["found"], r["questions"], r["guess"]) for r in results] == [
        (1.0, True, 2, None),
        (wrong_guess, False, 0, "banana"),  # scored as the question "Is it a banana?"
        (1.0, True, 1, None),
        (red, False, 2, None),
    ]
    assert len(replies) == 6 and len(sampler.calls) == 6
    prompts = [tokenizer.decode(prompt) for prompt, *_ in sampler.calls]
    assert all('"name": "ask"' in p and '"name": "guess"' in p for p in prompts)  # CrewAI sent both tools
    assert "<tool_response>\nNo.\n</tool_response>" in prompts[1]  # the ask tool's reply, as a tool message
    assert prompts[3].endswith('<tool_call>\n{"name": "ask", "arguments": ')

    built = build_trajectories(spans)
    calls = sorted(built.triplets.to_pylist(), key=lambda r: (r["task_id"], r["turn"]))
    order = [
        ("20q-ask", 0),
        ("20q-ask", 1),
        ("20q-forced", 0),
        ("20q-guess", 0),
        ("20q-limit", 0),
        ("20q-limit", 1),
    ]
    assert [(c["task_id"], c["turn"]) for c in calls] == order
    by_prompt = {tuple(prompt): reply for (prompt, *_), reply in zip(sampler.calls, replies, strict=True)}
    eos = tokenizer.eos_token_id
    for call in calls:  # each call's ids are exactly what the endpoint sampled for that prompt
        reply = by_prompt[tuple(call["prompt_token_ids"])]
        ids = tokenizer.encode(reply, add_special_tokens=False)
        forced = call["task_id"] == "20q-forced"  # one call allowed: sampling stops at </tool_call>
        assert call["response_token_ids"] == (ids if forced else [*ids, eos])
        assert len(call["response_logprobs"]) == len(call["response_token_ids"])
    assert {c["token_source"] for c in calls} == {"server"} and {c["agent_name"] for c in calls} == {"player"}
    trajectories = sorted(
        built.trajectories.drop_columns(["end_time"]).to_pylist(), key=lambda t: t["task_id"]
    )
    rewards = [(t["task_id"], t["num_turns"], t["reward"]) for t in trajectories]
    expected = [
        ("20q-ask", 2, 1.0),
        ("20q-forced", 1, 1.0),
        ("20q-guess", 1, wrong_guess),
        ("20q-limit", 2, red),
    ]
    assert rewards == expected


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smollm2_trains_a_step_through_the_runner(tmp_path: Path) -> None:
    """The example's SmolLM2 config, one step: the runner's collector subprocess, endpoint and follow
    trainer in .venv, its agent worker in .venv-crewai playing real games of the real model."""
    example = ROOT / "examples" / "twenty_questions"
    config = yaml.safe_load((example / "smollm2.yaml").read_text())
    (env,) = config["environments"]
    env.update(  # a short game: one group of four, one question each
        agent=f"{example / 'crew.py'}:play",
        tasks=f"{example / 'crew.py'}:load_tasks",
        group_size=4,
        agent_kwargs={**env["agent_kwargs"], "max_questions": 1},
    )
    config["follow"]["worker_python"] = str(ROOT / ".venv-crewai" / "bin" / "python")
    short = tmp_path / "smollm2.yaml"
    short.write_text(yaml.safe_dump(config))
    command = [
        sys.executable, "-m", "tinkertrace.cli.main", "train", "--follow", "--config", str(short),
        "--log-dir", str(tmp_path), "--lora-rank", "2", "--max-steps", "1", "--workers", "1",
        "--group-timeout", "300", "--max-seconds", "600", "--keep-constant-reward-groups", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["served_version"] == 1, summary
    assert summary["agent_errors"] == []

    name = "smollm2-135m-instruct"
    tokenizer = load_tokenizer(name)
    built = build_trajectories(tmp_path / "spans")
    calls = built.triplets.to_pylist()
    assert len({c["rollout_id"] for c in calls}) >= 4  # at least the trained group's games
    assert {c["agent_name"] for c in calls} == {"player"} and {c["token_source"] for c in calls} == {"server"}
    opened_ask = '<|im_start|>assistant\n<tool_call>\n{"name": "ask", "arguments": '
    asks = 0
    for call in calls:
        prompt = tokenizer.decode(call["prompt_token_ids"])
        # SmolLM2's ChatML with the tools CrewAI sent, and the call of ask the endpoint opened; or, once a
        # question was asked (SmolLM2's bare-value arguments read as a valid call), CrewAI's own last turn
        # asking for the final answer without tools
        assert prompt.startswith("<|im_start|>system\n") and '"name": "ask"' in prompt
        final_turn = prompt.endswith("<|im_start|>assistant\n") and "Final answer" in prompt
        assert prompt.endswith(opened_ask) or final_turn, prompt[-400:]
        asks += prompt.endswith(opened_ask)
        assert 0 < len(call["response_token_ids"]) <= 40  # the config's max_tokens
        assert len(call["response_logprobs"]) == len(call["response_token_ids"])
        assert all(lp <= 0.0 for lp in call["response_logprobs"])
    assert asks >= 4  # at least one question in each of the trained group's games
    played = [json.loads(line) for line in (tmp_path / "agents" / "worker-0.jsonl").read_text().splitlines()]
    assert played and all(row["error"] is None and 0.0 <= row["reward"] <= 1.0 for row in played)
    # Each logged game was scored as the worker logged it. A worker killed mid-round (after stop_workers'
    # grace) can leave a game in the spans whose line it did not write: compare the logged groups only.
    scored = {(row["task_id"], round(row["reward"], 6)) for row in played}
    logged = {row["task_id"] for row in played}
    built_rewards = {
        (t["task_id"], round(t["reward"], 6))
        for t in built.trajectories.select(["task_id", "reward"]).to_pylist()
        if t["task_id"] in logged
    }
    assert built_rewards and built_rewards <= scored
