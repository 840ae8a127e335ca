"""``tinkertrace engine``: the local engine served over Tinker's own REST API.

The unchanged ``tinker`` SDK (0.38) talks to it: ``tinker.ServiceClient(base_url=...,
api_key="tml-...")``. See :mod:`.app` for the routes and docs/engine.md for what is served.
"""

from tinkertrace.engine_server.app import EngineSettings, create_app

__all__ = ["EngineSettings", "create_app"]
