"""tinkertrace: turn an existing LLM agent into token-level RL training data, and train it.

The SDK surface::

    import tinkertrace

    tinkertrace.init(spans_dir="spans/")          # or endpoint="http://127.0.0.1:4318", or env vars

    @tinkertrace.traced_rollout
    def solve(task): ...                          # every LLM call inside is captured
        tinkertrace.emit_reward(1.0)
"""

from __future__ import annotations

__version__ = "0.1.0"
