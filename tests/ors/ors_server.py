"""The ORS server the tests run (in .venv-openreward): the example's environments, plus ``faulty``
(a tool that raises), and ``--idle-s S``: sessions idle for S seconds are reaped by the server's
own reaper (it reaps after 900 s idle, checking every 5 s; each session's last-ping time is moved
back by 900 - S seconds whenever it changes, so the reaper sees S seconds as 900); ``--only NAME``
serves that one environment, as a hosted deployment does."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "openreward"))
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

from environments import ENVIRONMENTS, text  # (found through the path above)
from openreward.environments import Environment, Server, ToolOutput, tool

REAP_AFTER_S = 900.0  # openreward 0.1.167's reaper threshold (environments/server.py)


class Faulty(Environment):
    """One task; ``explode`` raises, ``fine`` answers."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"id": "only"}]

    def get_prompt(self) -> list:
        return text("Call explode.")

    @tool
    async def explode(self) -> ToolOutput:
        """Raises."""
        raise RuntimeError("the tool broke")

    @tool
    async def fine(self) -> ToolOutput:
        """Answers."""
        return ToolOutput(blocks=text("ok"), reward=0.5)


def age_sessions(server: Server, idle_s: float) -> None:
    """Forever: move each session's last-ping time back by ``REAP_AFTER_S - idle_s`` when it changes."""
    aged: dict[str, float] = {}
    pings = server._last_ping  # the reaper's own bookkeeping (no setting shortens it)
    while True:
        for sid, stamp in list(pings.items()):
            if aged.get(sid) != stamp:
                aged[sid] = pings[sid] = stamp - (REAP_AFTER_S - idle_s)
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle-s", type=float, default=None)
    parser.add_argument("--only", default=None, help="serve this one environment (as a deployment does)")
    args = parser.parse_args()
    environments = [*ENVIRONMENTS, Faulty]
    server = Server([e for e in environments if args.only in (None, e.__name__.lower())])
    if args.idle_s is not None:
        threading.Thread(target=age_sessions, args=(server, args.idle_s), daemon=True).start()
    server.run(host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
