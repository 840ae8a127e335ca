"""Upload finished OpenReward rollouts through the ``openreward`` SDK's rollout API, as the OpenReward
trainer does: one rollout per episode under the run name, each chat message logged with
``log_openai_completions``, the tool messages with the reward their call earned, the last one finished.

A standalone script (standard library and ``openreward`` only), run in the environment server's venv
by :class:`tinkertrace.ors.upload.SpoolUploader` for the whole training run::

    .venv-openreward/bin/python src/tinkertrace/ors/uploader.py SPOOL_DIR

It follows the spool folder: every complete line appended to a ``rollouts-*.jsonl`` file (one per
agent worker process) is one finished rollout (written by the ORS agent: ``run_name``,
``environment``, ``split``, ``index``, ``rollout_name``, ``messages`` (chat-completions messages),
``rewards`` (tool message index → reward) and ``finished``) and is handed to the SDK when it is
seen; the SDK sends it within a second. How far each file was read is kept in ``uploaded.json``, so
a run resumed in the same folder sends nothing twice. When ``SPOOL_DIR/stop`` appears it reads what
is left, lets the SDK flush, and prints how many rollouts it sent. ``$OPENREWARD_API_KEY`` authorises
it; ``$OPENREWARD_API_URL`` points it elsewhere than the hosted API.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

STOP = "stop"
OFFSETS = "uploaded.json"
POLL_S = 0.5


def send(api: Any, row: dict[str, Any]) -> None:
    """Hand one finished rollout to the SDK (it uploads in its background thread)."""
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


def new_rows(folder: Path, offsets: dict[str, int]) -> list[dict[str, Any]]:
    """The complete lines written to the spool files since ``offsets`` (advanced past them)."""
    rows = []
    for path in sorted(folder.glob("rollouts-*.jsonl")):
        with path.open("rb") as spool:
            spool.seek(offsets.get(path.name, 0))
            data = spool.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        rows += [json.loads(line) for line in complete.splitlines() if line.strip()]
        offsets[path.name] = offsets.get(path.name, 0) + len(complete)
    return rows


def main() -> None:
    from openreward import OpenReward  # type: ignore[import-not-found]  # in the environment server's venv

    folder = Path(sys.argv[1])
    marks = folder / OFFSETS
    offsets: dict[str, int] = json.loads(marks.read_text()) if marks.exists() else {}
    client = OpenReward(api_key=os.environ["OPENREWARD_API_KEY"])
    sent = 0
    with client.rollout as api:  # leaving it flushes what the SDK still holds
        while True:
            stopping = (folder / STOP).exists()  # checked first: the last read sees every line
            rows = new_rows(folder, offsets)
            for row in rows:
                send(api, row)
            sent += len(rows)
            if rows:
                marks.write_text(json.dumps(offsets))
            if stopping:
                break
            time.sleep(POLL_S)
    print(f"uploaded {sent} rollouts")


if __name__ == "__main__":
    main()
