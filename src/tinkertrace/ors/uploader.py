"""Upload finished OpenReward rollouts through the ``openreward`` SDK's rollout API, as the OpenReward
trainer does: one rollout per episode under the run name, each chat message logged with
``log_openai_completions``, the tool messages with the reward their call earned, the last one finished.

A standalone script (standard library and ``openreward`` only), run in the environment server's venv
by :func:`tinkertrace.ors.upload.upload_spool`::

    .venv-openreward/bin/python src/tinkertrace/ors/uploader.py SPOOL.jsonl

Each line of the spool is one finished rollout (written by the ORS agent): ``run_name``,
``environment``, ``split``, ``index``, ``rollout_name``, ``messages`` (chat-completions messages),
``rewards`` (tool message index → reward) and ``finished``. ``$OPENREWARD_API_KEY`` authorises it;
``$OPENREWARD_API_URL`` points it elsewhere than the hosted API. Prints how many rollouts it sent.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")


def main() -> None:
    from openreward import OpenReward  # type: ignore[import-not-found]  # in the environment server's venv

    with open(sys.argv[1], encoding="utf-8") as spool:
        rows = [json.loads(line) for line in spool if line.strip()]
    client = OpenReward(api_key=os.environ["OPENREWARD_API_KEY"])
    sent = 0
    with client.rollout as api:
        for row in rows:
            rollout = api.create(
                run_name=row["run_name"],
                rollout_name=row["rollout_name"],
                environment=row["environment"],
                split=row["split"],
                metadata={"task_index": row["index"]},
            )
            rewards = {int(k): v for k, v in row["rewards"].items()}
            last = len(row["messages"]) - 1
            for i, message in enumerate(row["messages"]):
                finished = row["finished"] and i == last
                rollout.log_openai_completions(message, reward=rewards.get(i), is_finished=finished)
            sent += 1
    print(f"uploaded {sent} rollouts")


if __name__ == "__main__":
    main()
