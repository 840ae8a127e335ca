"""examples/twenty_questions/crew.py: the CrewAI flow, run in its own environment (.venv-crewai, built by
``make crewai-env``), against the real sampling endpoint.

The first test scripts the model (a hosted-Tinker double behind the real endpoint) so the flow's whole
tool loop runs: CrewAI sends the tools, the endpoint's tool parser turns the model's ``<tool_call>``
into a structured call, CrewAI runs the tool and sends its result back as a ``tool`` message. The spans
carry exactly the sampled token ids and build into one trajectory per game. The second (slow) plays
real games of SmolLM2-135M-Instruct through the collector, the way the example trains.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tinkertrace.builder import build_trajectories
from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.netutil import BackgroundServer, free_ports
from tinkertrace.rollouts import load_ref
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.environments import require_built
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler
from tinkertrace.tokenizer import BUILTIN_MODEL, load_tokenizer

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
        if prompt.endswith('"arguments": '):  # tool_choice "ask": the endpoint opened the call
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
    ]
    with BackgroundServer(create_app(PolicyHolder(sampler, tokenizer, "test-model"))) as endpoint:
        spans = tmp_path / "spans"
        results = _play({"spans_dir": str(spans)}, endpoint.url + "/v1", games, "test-model", 180)
    score = load_ref(f"{ROOT / 'examples' / 'twenty_questions' / 'agent.py'}:score")
    wrong_guess = score(["Is it a banana?"], "apple", found=False)
    assert 0.0 < wrong_guess < 1.0
    assert [(r["reward"], r["found"], r["questions"], r["guess"]) for r in results] == [
        (1.0, True, 2, None),
        (wrong_guess, False, 0, "banana"),  # scored as the question "Is it a banana?"
        (1.0, True, 1, None),
    ]
    assert len(replies) == 4 and len(sampler.calls) == 4
    prompts = [tokenizer.decode(prompt) for prompt, *_ in sampler.calls]
    assert all('"name": "ask"' in p and '"name": "guess"' in p for p in prompts)  # CrewAI sent both tools
    assert "<tool_response>\nNo.\n</tool_response>" in prompts[1]  # the ask tool's reply, as a tool message
    assert prompts[3].endswith('<tool_call>\n{"name": "ask", "arguments": ')

    built = build_trajectories(spans)
    calls = sorted(built.triplets.to_pylist(), key=lambda r: (r["task_id"], r["turn"]))
    order = [("20q-ask", 0), ("20q-ask", 1), ("20q-forced", 0), ("20q-guess", 0)]
    assert [(c["task_id"], c["turn"]) for c in calls] == order
    by_prompt = {tuple(prompt): reply for (prompt, *_), reply in zip(sampler.calls, replies, strict=True)}
    eos = tokenizer.eos_token_id
    for call in calls:  # each call's ids are exactly what the endpoint sampled for that prompt
        reply = by_prompt[tuple(call["prompt_token_ids"])]
        assert call["response_token_ids"] == [*tokenizer.encode(reply, add_special_tokens=False), eos]
        assert len(call["response_logprobs"]) == len(call["response_token_ids"])
    assert {c["token_source"] for c in calls} == {"server"} and {c["agent_name"] for c in calls} == {"player"}
    trajectories = sorted(built.trajectories.to_pylist(), key=lambda t: t["task_id"])
    rewards = [(t["task_id"], t["num_turns"], t["reward"]) for t in trajectories]
    assert rewards == [("20q-ask", 2, 1.0), ("20q-forced", 1, 1.0), ("20q-guess", 1, wrong_guess)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_plays_real_games_through_the_collector(tmp_path: Path) -> None:
    from tinkertrace.evaluation import local_endpoint

    name = "smollm2-135m-instruct"
    http_port, grpc_port = free_ports(2)
    command = collector_command(tmp_path / "spans", http_port, "--grpc-port", str(grpc_port))
    collector = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tasks = [{"id": f"20q-{w}", "category": "animal", "answer": w} for w in ("cat", "horse")]
    try:
        wait_until_healthy(collector, http_port, timeout=60)
        with local_endpoint(name, base_dir=tmp_path / "engine") as url:
            games = [(t, {"max_questions": 2}) for t in tasks]
            results = _play({"endpoint": f"http://127.0.0.1:{http_port}"}, url, games, name, 420)
    finally:
        collector.send_signal(signal.SIGTERM)  # the collector writes what it holds, then exits
        output, _ = collector.communicate(timeout=60)
    assert collector.returncode == 0, output
    assert all(0.0 <= r["reward"] <= 1.0 and r["questions"] <= 2 for r in results), results

    tokenizer = load_tokenizer(name)
    built = build_trajectories(tmp_path / "spans")
    calls = built.triplets.to_pylist()
    assert {c["task_id"] for c in calls} == {"20q-cat", "20q-horse"}
    assert {c["agent_name"] for c in calls} == {"player"} and {c["token_source"] for c in calls} == {"server"}
    for call in calls:
        prompt = tokenizer.decode(call["prompt_token_ids"])
        # SmolLM2's ChatML with the tools CrewAI sent, and the call of ask the endpoint opened
        assert prompt.startswith("<|im_start|>system\n") and '"name": "ask"' in prompt
        assert prompt.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "ask", "arguments": ')
        assert 0 < len(call["response_token_ids"]) <= 40
        assert len(call["response_logprobs"]) == len(call["response_token_ids"])
        assert all(lp <= 0.0 for lp in call["response_logprobs"])
    games = {t["task_id"]: t for t in built.trajectories.to_pylist()}
    rewards = {f"20q-{task['answer']}": r["reward"] for task, r in zip(tasks, results, strict=True)}
    assert {k: t["reward"] for k, t in games.items()} == pytest.approx(rewards)
