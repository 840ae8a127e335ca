"""The served model's context window: how much room a prompt leaves, shared by every API's routes.

A request's reply may use what the prompt leaves of the context (``limit - prompt_tokens``): a
``max_tokens`` (``max_output_tokens``, ``max_completion_tokens``) above that room is clamped to it,
as vLLM does, and a prompt that leaves no room raises :class:`PromptTooLong`, which each API's routes
answer with that API's own context error (OpenAI ``context_length_exceeded``, Anthropic "prompt is
too long: N tokens > M maximum"), so a harness compacts its history instead of failing.

``limit`` is ``None`` where the endpoint does not know the model's context (a sampler that does not
say): nothing is clamped or refused here, and the sampler's own check applies.
"""

from __future__ import annotations

from typing import Any


class PromptTooLong(ValueError):
    """A prompt of ``prompt_tokens`` tokens leaves no room for a reply in a ``limit``-token context."""

    def __init__(self, prompt_tokens: int, limit: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        super().__init__(
            f"a prompt of {prompt_tokens} tokens leaves no room for a reply in the model's "
            f"{limit}-token context"
        )


def room(prompt_tokens: int, limit: int | None) -> int | None:
    """Tokens a reply may use after a ``prompt_tokens``-token prompt (``None``: no known limit).

    Raises :class:`PromptTooLong` when the prompt leaves no room (fills the context or more)."""
    if limit is None:
        return None
    left = limit - prompt_tokens
    if left < 1:
        raise PromptTooLong(prompt_tokens, limit)
    return left


def clamp_max_tokens(requested: int, prompt_tokens: int, limit: int | None) -> int:
    """``requested`` reply tokens, at most the room ``prompt_tokens`` leaves in a ``limit``-token
    context; raises :class:`PromptTooLong` when there is none."""
    left = room(prompt_tokens, limit)
    return requested if left is None else min(requested, left)


def context_limit(sampling_client: Any) -> int | None:
    """The context length of the model behind ``sampling_client``, where it says: a
    ``context_length`` attribute, or the local engine's model config (``max_position_embeddings``);
    ``None`` for a client that does not say (hosted Tinker's: the service checks)."""
    declared = getattr(sampling_client, "context_length", None)
    if isinstance(declared, int) and declared > 0:
        return declared
    decoder = getattr(sampling_client, "decoder", None)
    config = getattr(getattr(decoder, "model", None), "config", None)
    length = getattr(config, "max_position_embeddings", None)
    return int(length) if isinstance(length, int) and length > 0 else None
