"""The endpoint over the real local engine (built-in tiny model): ids equal what was sampled, and
weights swap mid-traffic (in process, over the admin API, from the checkpoint record)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tinkertrace import semconv
from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL
from tinkertrace.serving.policy import PolicyHolder

MODEL = BUILTIN_MODEL
USER = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> ServiceClient:
    return ServiceClient(base_dir=tmp_path_factory.mktemp("engine"), device="cpu")


@pytest.fixture(scope="module")
def sampler_paths(service: ServiceClient) -> list[str]:
    """Two saved sampler checkpoints (LoRA runs with different seeds)."""
    paths = []
    for seed in (1, 2):
        trainer = service.create_lora_training_client(MODEL, rank=2, seed=seed).result()
        paths.append(trainer.save_weights_for_sampler(f"seed{seed}").result().path)
    return paths


def _base(service: ServiceClient) -> Any:
    return service.create_sampling_client(base_model=MODEL).result()


def test_returned_ids_and_logprobs_equal_what_the_engine_sampled(
    service, tokenizer, recording, start_server, openai_client
) -> None:
    sampler = recording(_base(service))
    server = start_server(PolicyHolder(sampler, tokenizer, MODEL), batch_window_s=0)
    client = openai_client(server)

    resp = client.chat.completions.create(model=MODEL, messages=USER, n=2, max_tokens=12, logprobs=True)
    prompt_ids, sampled = sampler.responses[-1]
    assert resp.model_extra["prompt_token_ids"] == prompt_ids
    for choice, seq in zip(resp.choices, sampled.sequences, strict=True):
        assert choice.model_extra["token_ids"] == list(seq.tokens)
        assert [lp.logprob for lp in choice.logprobs.content] == pytest.approx(seq.logprobs, abs=1e-6)
        assert choice.message.content == tokenizer.decode(seq.tokens, skip_special_tokens=True)
        assert choice.finish_reason == ("stop" if seq.stop_reason == "stop" else "length")

    stream = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=12, stream=True, logprobs=True
    )
    ids, logprobs = [], []
    for chunk in stream:
        for ch in chunk.choices:
            ids += (ch.model_extra or {}).get("token_ids") or []
            logprobs += [lp.logprob for lp in (ch.logprobs.content if ch.logprobs else None) or []]
    seq = sampler.responses[-1][1].sequences[0]
    assert ids == list(seq.tokens) and logprobs == pytest.approx(seq.logprobs, abs=1e-6)

    resp = client.completions.create(model=MODEL, prompt="The answer is", max_tokens=8, logprobs=0, seed=7)
    prompt_ids, sampled = sampler.responses[-1]
    assert prompt_ids == tokenizer.encode("The answer is")
    assert resp.choices[0].model_extra["token_ids"] == list(sampled.sequences[0].tokens)
    assert resp.choices[0].logprobs.token_logprobs == pytest.approx(sampled.sequences[0].logprobs, abs=1e-6)
    again = client.completions.create(model=MODEL, prompt="The answer is", max_tokens=8, seed=7)
    assert again.choices[0].model_extra["token_ids"] == resp.choices[0].model_extra["token_ids"]  # seeded


def test_weights_swap_mid_traffic_without_failed_requests(
    service, tokenizer, recording, start_server, openai_client
) -> None:
    samplers = {0: recording(_base(service), tag=0)}
    policy = PolicyHolder(samplers[0], tokenizer, MODEL)
    server = start_server(policy)
    failures: list[BaseException] = []
    seen: list[list[tuple[int, list[int]]]] = [[] for _ in range(3)]
    stop = threading.Event()

    def fire(worker: int) -> None:
        client = openai_client(server)
        k = 0
        while not stop.is_set() or k < 3:
            k += 1
            try:
                if k % 3 == 0:
                    chunks = list(
                        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, stream=True)
                    )
                    version = chunks[0].model_extra[semconv.RESPONSE_POLICY_VERSION]
                    ids = [
                        t
                        for c in chunks
                        for ch in c.choices
                        for t in (ch.model_extra or {}).get("token_ids") or []
                    ]
                elif k % 3 == 1:
                    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4)
                    version, ids = (
                        r.model_extra[semconv.RESPONSE_POLICY_VERSION],
                        r.choices[0].model_extra["token_ids"],
                    )
                else:
                    r = client.completions.create(model=MODEL, prompt=f"w{worker} ", max_tokens=4)
                    version, ids = (
                        r.model_extra[semconv.RESPONSE_POLICY_VERSION],
                        r.choices[0].model_extra["token_ids"],
                    )
                seen[worker].append((version, ids))
            except BaseException as exc:  # any failure fails the test
                failures.append(exc)
                return

    threads = [threading.Thread(target=fire, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for version in range(1, 5):
        time.sleep(0.25)
        samplers[version] = recording(_base(service), tag=version)
        policy.swap(samplers[version], version)
    time.sleep(0.25)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    versions = [v for worker in seen for v, _ in worker]
    assert len(set(versions)) >= 3, versions  # traffic saw several versions
    for worker in seen:
        per_worker = [v for v, _ in worker]
        assert per_worker == sorted(per_worker)  # a later request never gets an older policy
        for version, ids in worker:
            assert ids in samplers[version].sequences()  # sampled by that version's sampler


def test_admin_api_swaps_saved_weights(
    service, sampler_paths, tokenizer, start_server, openai_client
) -> None:
    def loader(path: str) -> Any:
        return service.create_sampling_client(model_path=path)

    policy = PolicyHolder(_base(service), tokenizer, MODEL, loader=loader)
    server = start_server(policy, admin_token="adm-token")
    url = server.url + "/admin/policy"
    auth = {"Authorization": "Bearer adm-token"}
    assert httpx.post(url, json={"model_path": sampler_paths[0], "version": 1}).status_code == 401
    assert (
        httpx.post(
            url, json={"model_path": sampler_paths[0]}, headers={"Authorization": "Bearer no"}
        ).status_code
        == 401
    )
    resp = httpx.post(url, json={"model_path": sampler_paths[0], "version": 1}, headers=auth, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["policy_version"] == 1 and resp.json()["model_path"] == sampler_paths[0]
    chat = openai_client(server).chat.completions.with_raw_response.create(
        model=MODEL, messages=USER, max_tokens=3
    )
    assert chat.headers[semconv.HEADER_POLICY_VERSION] == "1"
    assert chat.parse().model_extra["policy_version"] == 1
    stale = httpx.post(url, json={"model_path": sampler_paths[1], "version": 1}, headers=auth)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_version"
    missing = httpx.post(
        url, json={"model_path": "tinker://nope/sampler_weights/x", "version": 5}, headers=auth
    )
    assert missing.status_code == 400 and "tinker://nope" in missing.json()["error"]["message"]
    assert httpx.post(url, json={"version": 5}, headers=auth).json()["error"]["param"] == "model_path"
    assert httpx.get(url, headers=auth).json()["policy_version"] == 1  # still serving v1
    # without an admin token the admin API is off
    closed = start_server(PolicyHolder(_base(service), tokenizer, MODEL, loader=loader))
    assert httpx.post(closed.url + "/admin/policy", json={"model_path": sampler_paths[0]}).status_code == 403


def test_checkpoint_record_is_followed(
    service, sampler_paths, tokenizer, start_server, tmp_path: Path
) -> None:
    record = tmp_path / "checkpoints.jsonl"
    record.write_text(json.dumps({"name": "000001", "step": 1, "sampler_path": sampler_paths[0]}) + "\n")
    policy = PolicyHolder(
        _base(service), tokenizer, MODEL, loader=lambda p: service.create_sampling_client(model_path=p)
    )
    server = start_server(policy, watch_checkpoints=record, watch_poll_s=0.05)

    def version_when(expected: int) -> int:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and policy.version != expected:
            time.sleep(0.05)
        return policy.version

    assert version_when(1) == 1 and policy.current().model_path == sampler_paths[0]
    with record.open("a") as fh:
        fh.write("{torn line\n")
        fh.write(json.dumps({"name": "state-only", "step": 2, "state_path": "tinker://x/weights/y"}) + "\n")
        fh.write(json.dumps({"name": "000003", "step": 3, "sampler_path": sampler_paths[1]}) + "\n")
    assert version_when(3) == 3 and policy.current().model_path == sampler_paths[1]
    assert httpx.get(server.url + "/health").json()["policy_version"] == 3
    assert server.app.state.endpoint.watcher.skipped_lines == 1  # the torn line
