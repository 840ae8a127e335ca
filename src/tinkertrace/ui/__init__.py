"""``tinkertrace ui``: a local, read-only web app over a run's files (spans, built tables, metrics).

``create_app(RunIndex([run_dir]))`` gives the Starlette app; see docs/ui.md. The app loads on first use;
the settings alone are light.
"""

from typing import TYPE_CHECKING

from tinkertrace.lazy import lazy_attributes

if TYPE_CHECKING:  # what type checkers see; at run time each name loads on first use
    from tinkertrace.ui.app import create_app
    from tinkertrace.ui.index import RunIndex

__all__ = ["RunIndex", "create_app"]
__getattr__ = lazy_attributes(
    __name__, {"RunIndex": "tinkertrace.ui.index", "create_app": "tinkertrace.ui.app"}
)
