"""Span folders of whole groups with chosen rewards and replies cut by the reply cap, for the tests of
what happens when nothing (or little) can be trained (batch and follow mode)."""

from __future__ import annotations

from pathlib import Path

from tests.builder.conftest import SpanRows
from tinkertrace import semconv as sc
from tinkertrace.spanstore.writer import TEMP_PREFIX


def write_groups(
    folder: Path,
    groups: dict[str, list[float | None]],
    cut: list[list[bool]] | None = None,
    *,
    name: str = "part-0.parquet",
    token_ids: bool = True,
) -> None:
    """Per task, one rollout per reward (None: it emitted none, as a failed rollout); rollout ``i``'s
    turns (one each unless ``cut`` gives the turns of each rollout, each cut by the reply cap or not)
    extend each other, so they merge into one row. Without ``token_ids`` the LLM spans carry none (the
    builder makes no trajectory of them). Written to one file ``name``, as the collector writes: under
    a temporary name, then renamed (a follower never reads it half-written)."""
    rows = SpanRows()
    for task, rewards in groups.items():
        for i, reward in enumerate(rewards):
            rid = f"{task}-{i}"
            turns = cut[i] if cut is not None else [False]
            root = rows.rollout(rid, task=task, llm_calls=len(turns), rewards=int(reward is not None))
            prompt: list[int] = [10 + i, 20]
            for k, was_cut in enumerate(turns):
                finish = {sc.GENAI_FINISH_REASONS: ["length" if was_cut else "stop"]}
                ids = (prompt, [30 + k]) if token_ids else ([], [])
                rows.llm(rid, root, *ids, start=2 * k + 1, end=2 * k + 2, task=task, attributes=finish)
                prompt = [*prompt, 30 + k, 40]
            if reward is not None:
                rows.reward(rid, root, reward, at=50)
    written = rows.write(folder, TEMP_PREFIX + name)
    written.rename(written.with_name(name))
