"""In-flight weight updates through the endpoint: a policy published while a request is being decoded
takes over its next tokens, and the per-token versions reach the wire (``policy_version_runs``), the
span the endpoint records, the span the agent's SDK records, and the builder's triplets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import httpx
import openai
import pytest
from tinker import types

from tinkertrace import semconv
from tinkertrace.builder.build import build_trajectories
from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.spanstore.reader import open_spans

MODEL = BUILTIN_MODEL
SWITCH_AT = 3  # the old weights sample the first three tokens (the prefill and two steps)
CHAT = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi, how can I help?<|im_end|>\n"


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> tuple[ServiceClient, Any]:
    """The engine and a trained snapshot to publish (one LoRA step away from the base model)."""
    service = ServiceClient(tmp_path_factory.mktemp("engine"), device="cpu", cpu_threads=1)
    trainer = service.create_lora_training_client(MODEL, rank=4, seed=1).result()
    ids = trainer.get_tokenizer().encode(CHAT, add_special_tokens=False)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    return service, trainer


def swap_after(holder: PolicyHolder, new_client: Any, calls: int) -> Any:
    """A forward hook on the served model that publishes ``new_client`` as version 1 after the served
    model's ``calls``-th forward pass (in the decoding thread, between two steps)."""
    seen = [0]

    def hook(*_: Any) -> None:
        seen[0] += 1
        if seen[0] == calls:
            holder.swap(new_client, 1)

    return holder.current().sampling_client.model.register_forward_hook(hook)


@pytest.mark.parametrize("inflight", ["keep-cache", "recompute-cache", "off"])
def test_versions_per_token_on_the_wire_in_both_spans_and_in_triplets(
    clients: tuple[ServiceClient, Any],
    tokenizer: Any,
    start_server: Callable[..., BackgroundServer],
    tmp_path: Path,
    inflight: str,
) -> None:
    import tinkertrace

    service, trainer = clients
    holder = PolicyHolder(
        service.create_sampling_client(base_model=MODEL).result(), tokenizer, MODEL, inflight=inflight
    )
    new_client = trainer.save_weights_and_get_sampling_client().result()
    spans = tmp_path / "spans"
    recorder = CallRecorder(spans_dir=spans)
    server = start_server(holder, recorder=recorder, batch_window_s=0)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    hook = swap_after(holder, new_client, SWITCH_AT)
    tinkertrace.init(spans_dir=spans)
    replies: list[Any] = []

    @tinkertrace.traced_rollout
    def agent(task: dict) -> float:
        replies.append(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a long story about the sea."}],
                max_tokens=16,
                seed=5,
                logprobs=True,
            )
        )
        return 1.0

    try:
        agent({"id": "t-inflight"})
        assert tinkertrace.flush()
    finally:
        tinkertrace.shutdown()
        hook.remove()
    assert recorder.close(30)
    [reply] = replies
    n = len(reply.choices[0].model_extra["token_ids"])
    assert n > SWITCH_AT, "the reply stopped before the update"
    want = [0, SWITCH_AT, 1, n - SWITCH_AT] if inflight != "off" else [0, n]
    assert holder.version == 1 and holder.taken_over == (inflight != "off")
    assert holder.current().sampling_client.decoder.recomputes == (inflight == "recompute-cache")
    assert reply.model_extra[semconv.RESPONSE_POLICY_VERSION_RUNS] == want
    assert reply.choices[0].model_extra[semconv.RESPONSE_POLICY_VERSION_RUNS] == want
    assert reply.model_extra[semconv.RESPONSE_POLICY_VERSION] == 0  # the first token's

    con = duckdb.connect()
    open_spans(con, spans)
    side = f"coalesce(json_extract_string(attributes, '$.\"{semconv.LLM_CAPTURE_SIDE}\"'), 'client')"
    runs = f"json_extract(attributes, '$.\"{semconv.POLICY_VERSION_RUNS}\"')"
    stored = con.execute(
        f"SELECT {side}, {runs}, policy_version FROM spans WHERE span_type = 'llm' ORDER BY 1"
    ).fetchall()
    assert [(s, json.loads(r), v) for s, r, v in stored] == [
        (semconv.CAPTURE_CLIENT, want, 0),
        (semconv.CAPTURE_SERVER, want, 0),
    ]
    [versions] = build_trajectories(spans).triplets.column("response_policy_versions").to_pylist()
    assert versions == [v for v, count in zip(want[::2], want[1::2], strict=True) for _ in range(count)]
    holder.close()


def test_every_api_names_the_versions_of_a_snapshot_clients_tokens(
    tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer]
) -> None:
    """A client that records no per-token versions (the hosted-Tinker double) sampled every token with
    the request's snapshot: one run, on chat (plain and streamed), completions, Responses and
    Anthropic Messages, and the SDK's parsers read it back."""
    import anthropic

    from tinkertrace.sdk.response_parse import parse_sse
    from tinkertrace.sdk.responses_api import parse_json as parse_response

    server = start_server(PolicyHolder(scripted(["one two three"] * 5), tokenizer, MODEL, version=7))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    key = semconv.RESPONSE_POLICY_VERSION_RUNS
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    n = len(chat.choices[0].model_extra["token_ids"])
    assert chat.model_extra[key] == chat.choices[0].model_extra[key] == [7, n]
    text = client.completions.create(model=MODEL, prompt="hi")
    assert text.choices[0].model_extra[key] == [7, len(text.choices[0].model_extra["token_ids"])]
    response = client.responses.create(model=MODEL, input="hi")
    assert response.model_extra[key] == [7, len(response.model_extra["output_token_ids"])]
    assert parse_response(response.model_dump_json().encode()).version_runs() == response.model_extra[key]
    message = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0).messages.create(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.model_extra[key] == [7, len(message.model_extra["output_token_ids"])]
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    ) as streamed:
        record = parse_sse(b"".join(streamed.iter_bytes()))
    assert record.version_runs() == [7, len(record.choices[0].token_ids or [])]
