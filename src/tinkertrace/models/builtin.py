"""The built-in model's name, for modules that must stay light (settings, command-line help).

``tinkertrace.models.tokenizer`` builds its tokenizer and ``tinkertrace.engine`` its weights; both import
transformers, so this name lives here.
"""

from typing import Final

BUILTIN_MODEL: Final = "tinkertrace/tiny-chat"
DEMO_MODEL: Final = f"{BUILTIN_MODEL}:small"  # the size the demo and its agents use
