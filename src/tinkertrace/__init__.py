"""tinkertrace: turn an existing LLM agent into token-level RL training data, and train it.

The SDK surface::

    import tinkertrace

    tinkertrace.init(spans_dir="spans/")          # or endpoint="http://127.0.0.1:4318", or env vars

    @tinkertrace.traced_rollout
    def solve(task): ...                          # every LLM call inside is captured
        tinkertrace.emit_reward(1.0)
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# re-exported from ``tinkertrace.sdk`` on first use, so ``import tinkertrace.<module>`` (and the CLI)
# stays fast; the SDK never imports this module back
__all__ = [
    "__version__",
    "agent_span",
    "current_rollout",
    "emit_reward",
    "flush",
    "in_context",
    "init",
    "shutdown",
    "stats",
    "traced_rollout",
]


def __getattr__(name: str) -> Any:
    """Load the SDK on first use of one of its names."""
    if name in __all__:
        from tinkertrace import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'tinkertrace' has no attribute {name!r}")
