"""``tinkertrace engine``: the local engine served over Tinker's own REST API.

The unchanged ``tinker`` SDK (0.38) talks to it: ``tinker.ServiceClient(base_url=...,
api_key="tml-...")``. See :mod:`.app` for the routes and docs/engine.md for what is served. The app
(starlette, tinker, torch) loads on first use; the settings alone are light.
"""

from typing import TYPE_CHECKING

from tinkertrace.engine_server.settings import EngineSettings
from tinkertrace.lazy import lazy_attributes

if TYPE_CHECKING:  # what type checkers see; at run time the app loads on first use
    from tinkertrace.engine_server.app import create_app

__all__ = ["EngineSettings", "create_app"]
__getattr__ = lazy_attributes(__name__, {"create_app": "tinkertrace.engine_server.app"})
