"""An ORS server that says how many sessions it holds (run in .venv-openreward): the example's
environments plus ``slow`` (its prompt takes ``--slow-s`` seconds, so its episodes are certain to be
under way when a test stops the run), and ``GET /health/sessions`` → ``{"open": N}``, the sessions
created and not yet deleted (the server's own table)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "openreward"))
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

from environments import ENVIRONMENTS, text  # (found through the path above)
from openreward.environments import Environment, Server, ToolOutput, tool

SLOW_S = float(os.environ.get("SLOW_PROMPT_S", "600"))


class Slow(Environment):
    """Four tasks whose prompt takes SLOW_S seconds; ``done`` ends the episode."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"id": str(i)} for i in range(4)]

    async def get_prompt(self) -> list:
        await asyncio.sleep(SLOW_S)
        return text("Call done.")

    @tool
    async def done(self) -> ToolOutput:
        """Ends the episode."""
        return ToolOutput(blocks=text("ok"), reward=1.0, finished=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = Server([*ENVIRONMENTS, Slow])

    @server.app.get("/health/sessions")  # under /health: the server redirects unknown first segments
    async def sessions() -> dict[str, int]:
        return {"open": len(server._active_envs)}

    server.run(host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
