"""Tokenizers for the local engine and the sampling endpoint (torch-free).

`BUILTIN_MODEL` names a byte-level tokenizer built in code: token id ``b`` is the byte ``b``
(0-255), followed by ChatML special tokens. It needs no files and no network. Any other name is
a local Hugging Face folder loaded with ``local_files_only=True``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

BUILTIN_MODEL = "tinkertrace/tiny-chat"

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END, PAD)
"""Special tokens of the built-in tokenizer, with ids 256, 257, 258, 259."""

BUILTIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- elif message['content'] is none -%}{%- set text = '' -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "<|im_start|>{{ message['role'] }}{{ '\\n' }}{{ text }}<|im_end|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}"
)
"""ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message; text parts of list content are joined."""


class TokenizerNotFoundError(FileNotFoundError):
    """The tokenizer name is neither the built-in model nor a local Hugging Face folder."""


def _build_byte_tokenizer() -> Tokenizer:
    """A tokenizer whose ids 0-255 are the raw bytes (no merges), decoded back losslessly."""
    byte_to_char = bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def builtin_tokenizer() -> PreTrainedTokenizerFast:
    """Build a fresh instance of the built-in byte-level ChatML tokenizer."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_build_byte_tokenizer(),
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[ENDOFTEXT, IM_START],
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.name_or_path = BUILTIN_MODEL
    return tok


def is_builtin(name: str) -> bool:
    """Whether ``name`` names the built-in model (``BUILTIN_MODEL`` or ``BUILTIN_MODEL:<size>``)."""
    return name == BUILTIN_MODEL or name.startswith(BUILTIN_MODEL + ":")


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Return the tokenizer for ``name_or_path`` (cached; never downloads).

    ``BUILTIN_MODEL`` (also with a size suffix, ``BUILTIN_MODEL + ":base"``) gives the built-in
    byte-level tokenizer. Anything else must be a local folder with Hugging Face tokenizer
    files; a missing folder raises `TokenizerNotFoundError`.
    """
    if is_builtin(name_or_path):
        return builtin_tokenizer()
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise TokenizerNotFoundError(
            f"tokenizer {name_or_path!r} not found: use {BUILTIN_MODEL!r} or a local Hugging Face "
            "model folder (nothing is downloaded)"
        )
    from transformers import AutoTokenizer  # imports torch: keep it off the built-in path

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerNotFoundError(f"no usable tokenizer in {str(path)!r}: {exc}") from exc
