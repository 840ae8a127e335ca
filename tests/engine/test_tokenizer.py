"""The built-in byte-level tokenizer and local-folder loading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tinkertrace.models.tokenizer import (
    BUILTIN_MODEL,
    BUILTIN_VOCAB_SIZE,
    IM_END,
    IM_START,
    TokenizerNotFoundError,
    load_tokenizer,
)


def test_bytes_round_trip_and_ids_are_bytes() -> None:
    tok = load_tokenizer(BUILTIN_MODEL)
    text = "héllo wörld 🤖\n\t  two  spaces"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_special_tokens_and_vocab() -> None:
    tok = load_tokenizer(BUILTIN_MODEL)
    assert len(tok) == BUILTIN_VOCAB_SIZE
    assert tok.eos_token == IM_END
    assert tok.eos_token_id == 258
    assert tok.pad_token_id == 259
    assert tok.encode(f"{IM_START}user", add_special_tokens=False) == [257, *b"user"]


def test_chat_template_chatml_with_generation_prompt() -> None:
    tok = load_tokenizer(BUILTIN_MODEL)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == tok.encode(text, add_special_tokens=False)
    no_prompt = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert no_prompt.endswith("there<|im_end|>\n")


def test_cached_and_deterministic() -> None:
    assert load_tokenizer(BUILTIN_MODEL) is load_tokenizer(BUILTIN_MODEL)
    sized = load_tokenizer(f"{BUILTIN_MODEL}:base")  # built-in sizes share the tokenizer
    assert sized.encode("hi<|im_end|>", add_special_tokens=False) == [104, 105, 258]


def test_local_folder_round_trip(tmp_path: Path) -> None:
    load_tokenizer(BUILTIN_MODEL).save_pretrained(tmp_path / "tok")
    tok = load_tokenizer(str(tmp_path / "tok"))
    assert tok.encode("hé", add_special_tokens=False) == [104, 195, 169]
    assert tok.eos_token == IM_END


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerNotFoundError, match="not found"):
        load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerNotFoundError, match="no usable tokenizer"):
        load_tokenizer(str(tmp_path / "empty"))


def test_builtin_path_does_not_import_torch() -> None:
    code = (
        "import sys; from tinkertrace.models.tokenizer import load_tokenizer, BUILTIN_MODEL; "
        "t = load_tokenizer(BUILTIN_MODEL); t.apply_chat_template([{'role':'user','content':'x'}]); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
