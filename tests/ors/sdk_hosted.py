"""Run in .venv-openreward by test_hosted.py: the real SDK plays one arithmetic episode on a hosted
``Owner/Name`` environment, its session server given by $OPENREWARD_SESSION_URL; prints the reward."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

from openreward import OpenReward


def main() -> None:
    client = OpenReward()
    env = client.environments.get(sys.argv[1])
    env.list_splits()
    env.list_tasks("test")
    env.list_tools()
    with env.session(split="test", index=0) as session:
        session.get_prompt()
        output = session.call_tool("submit", {"answer": "0"})
    print(output.reward)


if __name__ == "__main__":
    main()
