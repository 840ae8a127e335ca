"""A real BPE tokenizer for tests, built offline: Qwen's byte-level BPE vocabulary as a ``transformers``
fast tokenizer with a ChatML chat template that renders tools and tool calls.

The byte tokenizer of :mod:`tinkertrace.models.tokenizer` can never show BPE effects: text that tokenises
differently once it is part of a longer text, merges across turn boundaries. This one can. The ranks
come from ``qwen.tiktoken``, which the ``dashscope`` package (the ``dev`` extra) ships in its
``resources`` folder: 151,643 byte-level BPE tokens, the vocabulary of the Qwen, Qwen2, Qwen2.5 and
Qwen3 models, split by the same pre-tokenizer pattern. The added tokens follow with Qwen2.5/Qwen3's
ids (``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645, ... ``<think>``
151667), so ids match those models' tokenizers. Nothing is downloaded; the conversion of the ranks
into merges takes a few seconds and is done once per process.

Two chat templates: :data:`CHATML_TOOLS_TEMPLATE` renders every message as it is, so a conversation's
prompt grows by appending; :data:`QWEN3_TEMPLATE` also drops the ``<think>`` block of assistant
messages before the last user message, as Qwen3's template does, so the history the model sees
changes between turns.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

# The pre-tokenizer pattern of Qwen's tokenizers (one digit per piece).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2.5/Qwen3's further added tokens, in id order after SPECIAL (not special: decoded as text).
ADDED = (
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
    "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
    "</think>",
)  # fmt: skip
FIRST_ADDED_ID = 151643  # <|endoftext|>: the ranks end just before it

NL = "{{ '\\n' }}"  # a newline in the template's output (text outside tags is trimmed by ``-``)
_TOOLS_HEADER = (
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
)
_TOOLS_FOOTER = (
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call>\' }}'
)


def _template(drop_past_think: bool) -> str:
    """ChatML with a tools system block, assistant tool calls and tool results (Qwen2.5's layout)."""
    think = (
        "{%- if loop.index0 < ns.last_user and '</think>' in text -%}"
        "{%- set text = text.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
        if drop_past_think
        else ""
    )
    return (
        "{%- set ns = namespace(last_user=-1) -%}"
        "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
        "{%- endif -%}{%- endfor -%}"
        "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
        f"{{%- if tools -%}}<|im_start|>system{NL}"
        f"{{%- if has_system -%}}{{{{ messages[0]['content'] }}}}{NL}{NL}{{%- endif -%}}"
        f"{_TOOLS_HEADER}"
        f"{{%- for tool in tools -%}}{NL}{{{{ tool | tojson }}}}{{%- endfor -%}}"
        f"{_TOOLS_FOOTER}<|im_end|>{NL}"
        f"{{%- elif has_system -%}}<|im_start|>system{NL}{{{{ messages[0]['content'] }}}}<|im_end|>{NL}"
        "{%- endif -%}"
        "{%- for m in messages -%}"
        "{%- set text = m['content'] if m['content'] is string else '' -%}"
        "{%- if loop.first and m['role'] == 'system' -%}"
        "{%- elif m['role'] == 'assistant' -%}"
        f"{think}"
        f"<|im_start|>assistant{NL}{{{{ text }}}}"
        "{%- for call in m.get('tool_calls') or [] -%}"
        "{%- set f = call['function'] -%}"
        f"{{%- if text or not loop.first -%}}{NL}{{%- endif -%}}"
        f"<tool_call>{NL}{{{{ '{{\"name\": \"' ~ f['name'] ~ '\", \"arguments\": ' }}}}"
        "{%- if f['arguments'] is string -%}{{ f['arguments'] }}{%- else -%}{{ f['arguments'] | tojson }}"
        f"{{%- endif -%}}}}{NL}</tool_call>"
        f"{{%- endfor -%}}<|im_end|>{NL}"
        "{%- elif m['role'] == 'tool' -%}"
        f"<|im_start|>user{NL}<tool_response>{NL}{{{{ text }}}}{NL}</tool_response><|im_end|>{NL}"
        f"{{%- else -%}}<|im_start|>{{{{ m['role'] }}}}{NL}{{{{ text }}}}<|im_end|>{NL}"
        "{%- endif -%}"
        "{%- endfor -%}"
        f"{{%- if add_generation_prompt -%}}<|im_start|>assistant{NL}{{%- endif -%}}"
    )


CHATML_TOOLS_TEMPLATE = _template(drop_past_think=False)
QWEN3_TEMPLATE = _template(drop_past_think=True)


def qwen_ranks_file() -> Path:
    """``qwen.tiktoken`` inside the installed ``dashscope`` package (found without importing it)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the dashscope package (dev extra) is not installed: no Qwen BPE ranks")
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the dashscope package")
    return path


@functools.cache
def _tokenizer_json() -> str:
    """The converted ``tokenizers`` tokenizer as JSON (the slow part, done once)."""
    tok = TikTokenConverter(vocab_file=str(qwen_ranks_file()), pattern=QWEN_PATTERN).converted()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in ADDED])
    if tok.token_to_id(ADDED[-1]) != FIRST_ADDED_ID + len(SPECIAL) + len(ADDED) - 1:
        raise ValueError("qwen.tiktoken does not have Qwen's 151,643 ranks")
    return tok.to_str()


def qwen_tokenizer(*, drop_past_think: bool = False) -> PreTrainedTokenizerFast:
    """A fresh Qwen BPE fast tokenizer with :data:`QWEN3_TEMPLATE` (``drop_past_think``) or
    :data:`CHATML_TOOLS_TEMPLATE` as its chat template."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = QWEN3_TEMPLATE if drop_past_think else CHATML_TOOLS_TEMPLATE
    return tok


def save_qwen_tokenizer(folder: Path, *, drop_past_think: bool = False) -> Path:
    """Write the tokenizer to ``folder`` (a local Hugging Face folder, what ``tinkertrace.init``'s
    ``tokenizer`` option loads) and return it."""
    qwen_tokenizer(drop_past_think=drop_past_think).save_pretrained(folder)
    return Path(folder)
