"""Tokenizers for the local engine and the sampling endpoint (torch-free).

`BUILTIN_MODEL` names a byte-level tokenizer built in code: token id ``b`` is the byte ``b``
(0-255), followed by ChatML special tokens. It needs no files and no network. Any other name is
resolved by :func:`tinkertrace.models.model_folder` (a packaged model such as
``smollm2-135m-instruct``, a GGUF file, or a local Hugging Face folder) and loaded with
``local_files_only=True``.
"""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tinkertrace.models.builtin import BUILTIN_MODEL

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END, PAD)
"""Special tokens of the built-in tokenizer, with ids 256, 257, 258, 259."""

BUILTIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

_NL = "{{ '\\n' }}"  # newlines are written as expressions: whitespace control would strip literal ones
CHATML_TEMPLATE = (
    "{%- macro text_of(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is not none -%}{{ content | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') }}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    f"<|im_start|>system{_NL}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    f"{{{{ text_of(messages[0]['content']) }}}}{_NL}{_NL}"
    "{%- endif -%}"
    f"# Tools{_NL}<tools>"
    f"{{%- for tool in tools -%}}{_NL}{{{{ tool | tojson }}}}{{%- endfor -%}}{_NL}</tools>{_NL}"
    'Call a tool as <tool_call>{"name": <name>, "arguments": <args-json-object>}</tool_call>'
    f"<|im_end|>{_NL}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and tools and loop.first -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}<|im_start|>user{%- endif -%}"
    f"{_NL}<tool_response>{_NL}{{{{ text_of(message['content']) }}}}{_NL}</tool_response>"
    f"{{%- if loop.last or loop.nextitem['role'] != 'tool' -%}}<|im_end|>{_NL}{{%- endif -%}}"
    "{%- else -%}"
    f"<|im_start|>{{{{ message['role'] }}}}{_NL}{{{{ text_of(message['content']) }}}}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    f"{{%- if not loop.first or text_of(message['content']) -%}}{_NL}{{%- endif -%}}"
    f"<tool_call>{_NL}"
    '{"name": {{ fn[\'name\'] | tojson }}, "arguments": '
    "{%- if fn['arguments'] is string -%}{{ ' ' + fn['arguments'] }}"
    "{%- else -%}{{ ' ' }}{{ fn['arguments'] | tojson }}{%- endif -%}"
    f"}}{_NL}</tool_call>"
    "{%- endfor -%}"
    f"<|im_end|>{_NL}"
    "{%- endif -%}"
    "{%- endfor -%}"
    f"{{%- if add_generation_prompt -%}}<|im_start|>assistant{_NL}{{%- endif -%}}"
)
"""ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message; text parts of list content are joined.

With ``tools`` the template writes them Qwen/Hermes style into the system message, assistant
``tool_calls`` as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks, and consecutive
``tool`` messages as one user turn of ``<tool_response>`` blocks (what the ``hermes`` parser reads).
"""


def with_tool_template(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give a ChatML model whose own template knows no tools (SmolLM2) :data:`CHATML_TEMPLATE` as its
    ``tool_use`` template: ``apply_chat_template`` picks it whenever ``tools`` are passed (Hugging Face's
    named-template rule) and the model's own template otherwise, so tool definitions, assistant
    ``tool_calls`` and ``tool`` results are rendered (Hermes style, read back by the ``hermes`` tool
    parser) instead of silently dropped. Other templates are left as they are."""
    template = tokenizer.chat_template
    if isinstance(template, str) and IM_START in template and "tools" not in template:
        tokenizer.chat_template = {"default": template, "tool_use": CHATML_TEMPLATE}
    return tokenizer


class TokenizerNotFoundError(FileNotFoundError):
    """The tokenizer name is neither the built-in model nor a model :mod:`.catalog` resolves."""


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
    byte-level tokenizer. Anything else is resolved by :func:`tinkertrace.models.model_folder`: a
    packaged model name (``smollm2-135m-instruct``), a ``.gguf`` file (converted once, with its chat
    template) or a local folder with Hugging Face tokenizer files. A name that resolves to nothing
    raises `TokenizerNotFoundError` (its message names a missing optional extra). A ChatML template
    without tools gets a ``tool_use`` companion (:func:`with_tool_template`).
    """
    if is_builtin(name_or_path):
        return builtin_tokenizer()
    from tinkertrace.models.catalog import ModelNotFoundError, model_folder

    try:
        path = model_folder(name_or_path)
    except ModelNotFoundError as exc:
        raise TokenizerNotFoundError(str(exc).replace("model ", "tokenizer ", 1)) from exc
    from transformers import AutoTokenizer  # imports torch: keep it off the built-in path

    try:
        return with_tool_template(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    except (OSError, ValueError) as exc:
        raise TokenizerNotFoundError(f"no usable tokenizer in {str(path)!r}: {exc}") from exc
