"""``tinkertrace ui``: a local, read-only web app over a run's files (spans, built tables, metrics).

``create_app(RunIndex([run_dir]))`` gives the Starlette app; see docs/ui.md.
"""

from tinkertrace.ui.app import create_app
from tinkertrace.ui.index import RunIndex

__all__ = ["RunIndex", "create_app"]
