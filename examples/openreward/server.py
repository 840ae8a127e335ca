"""Serve the example's OpenReward environments (``arithmetic``, ``whodunit``) over ORS on loopback.

Run in the environment server's own venv (``make openreward-env``)::

    OPENREWARD_DISABLE_UPDATE_CHECK=1 .venv-openreward/bin/python examples/openreward/server.py --port 8080
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

from environments import ENVIRONMENTS  # (found through the path above)
from openreward.environments import Server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    Server(ENVIRONMENTS).run(host=args.host, port=args.port)


if __name__ == "__main__":
    main()
