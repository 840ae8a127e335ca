"""The local Tinker-compatible engine: `ServiceClient`, `TrainingClient`, `SamplingClient`.

Same methods and return types as the `tinker` SDK (real `tinker.types` objects, futures with
`.result()` and `await`), running a torch model on this machine. See docs/engine.md.
"""

from tinkertrace.extras import require

require("engine", "the local engine")  # torch and peft: one clear line instead of an ImportError

from tinkertrace.engine.model import BUILTIN_SIZES, DEFAULT_BUILTIN_SIZE, ModelNotFoundError
from tinkertrace.engine.sampling import SamplingClient
from tinkertrace.engine.service import ServiceClient
from tinkertrace.engine.storage import CheckpointError, default_base_dir
from tinkertrace.engine.training import TrainingClient

__all__ = [
    "BUILTIN_SIZES",
    "DEFAULT_BUILTIN_SIZE",
    "CheckpointError",
    "ModelNotFoundError",
    "SamplingClient",
    "ServiceClient",
    "TrainingClient",
    "default_base_dir",
]
