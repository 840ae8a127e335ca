"""The run page opens with what a person looks at first (issue 51): the reward curve and reward by
policy version as plots within the first screen, then the counts, then the tables; on a run with
60 policy versions, in real Chromium at 1280x900."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace.ui.run_metrics import version_series
from tinkertrace.ui.server import UiServer

from .conftest import open_page, rollout_spans

VERSIONS = 60  # a 60-step follow run: one policy version per step
SCREEN = {"width": 1280, "height": 900}


def versions_plot(points: int) -> str:
    return f'.plot[data-title="reward by policy version"][data-points="{points}"]'


def _rollouts(folder: Path, versions: range, name: str) -> None:
    """Two rollouts per policy version, in our SDK's span form; version v's rewards are 0 and v/100."""
    rows = [
        row
        for version in versions
        for k, reward in enumerate((0.0, version / 100))
        for row in rollout_spans(f"r{version}-{k}", f"{version:x}{k}", f"task-{version % 5}", version, reward)
    ]
    part = folder / "spans" / "date=2026-12-08" / "hour=00"
    part.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.spans()), part / f"{name}.parquet")


@pytest.fixture
def long_run(tmp_path: Path) -> Path:
    """Spans sampled by 60 policy versions and a 60-step metrics.jsonl."""
    root = tmp_path / "run"
    _rollouts(root, range(VERSIONS), "a")
    (root / "train").mkdir()
    steps = [{"step": s, "env/all/reward/total": s / 200, "optim/loss": 1 / (s + 1)} for s in range(VERSIONS)]
    (root / "train" / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    return root


@pytest.fixture
def screen(browser: Any) -> Iterator[Any]:
    """A fresh 1280x900 page; JavaScript errors on it fail the test."""
    yield from open_page(browser, SCREEN)


@pytest.mark.slow
def test_the_reward_plots_lead_the_page_above_the_counts_and_tables(long_run: Path, screen: Any) -> None:
    with UiServer([long_run], refresh_s=0.2) as server:
        screen.goto(server.url)
        curve = screen.locator('.plot[data-title="reward"]')
        curve.locator("canvas").wait_for()
        top = curve.bounding_box()
        assert top["y"] + top["height"] <= SCREEN["height"], f"the reward curve starts {top['y']:.0f} px down"
        by_version = screen.locator(versions_plot(VERSIONS))
        by_version.locator("canvas").wait_for()
        beside = by_version.bounding_box()
        assert beside["y"] + beside["height"] <= SCREEN["height"]
        counts = screen.locator("#counts").bounding_box()
        tables = [t.bounding_box() for t in screen.locator("main table:not(.u-legend)").all()]
        plots_end = max(top["y"] + top["height"], beside["y"] + beside["height"])
        assert plots_end <= counts["y"] < SCREEN["height"]
        shown = [box["y"] for box in tables if box is not None]  # a folded table has no box
        assert shown and min(shown) > counts["y"] + counts["height"]
        # nothing lost: the 60-row table is there, folded, and opens on a click
        rows = screen.locator("#by-version tbody tr")
        assert rows.count() == VERSIONS and not rows.first.is_visible()
        screen.locator("#by-version-details summary").click()
        assert rows.last.is_visible() and rows.last.locator("td").first.inner_text() == str(VERSIONS - 1)
        assert rows.first.bounding_box()["y"] > screen.locator("#plots").bounding_box()["y"]


@pytest.mark.slow
def test_new_versions_reach_the_plot_and_an_opened_table_stays_open(long_run: Path, screen: Any) -> None:
    with UiServer([long_run], refresh_s=0.2) as server:
        screen.goto(server.url)
        screen.locator(versions_plot(VERSIONS)).wait_for()
        screen.locator("#by-version-details summary").click()
        _rollouts(long_run, range(VERSIONS, VERSIONS + 2), "b")  # the run goes on: two more versions
        screen.locator(versions_plot(VERSIONS + 2)).wait_for()
        newest = screen.locator(f'#by-version tr[data-version="{VERSIONS + 1}"]')
        newest.wait_for()  # the table reloaded in place ...
        assert newest.is_visible()  # ... and stayed open


def test_version_series_plots_the_quartiles_or_each_environment() -> None:
    def row(version: int | None, env: str | None, mean: float, rollouts: int = 2) -> dict[str, Any]:
        return {"policy_version": version, "environment": env, "rollouts": rollouts,
                "mean": mean, "q1": mean - 0.1, "median": mean, "q3": mean + 0.1}  # fmt: skip

    plain = version_series([row(None, None, 0.5, 3), row(2, None, 0.4), row(0, None, 0.2)])
    assert plain["versions"] == [0, 2] and plain["unversioned"] == 3 and not plain["split"]
    (panel,) = plain["panels"]
    assert panel["names"] == ["mean", "q1", "median", "q3"]
    assert panel["values"][0] == [0.2, 0.4] and panel["values"][3] == pytest.approx([0.3, 0.5])
    split = version_series([row(0, "math", 0.1), row(0, None, 0.3), row(1, "math", 0.2)])
    assert split["versions"] == [0, 1] and split["split"]
    assert split["panels"][0]["names"] == ["mean math", "mean other"]
    assert split["panels"][0]["values"] == [[0.1, 0.2], [0.3, None]]
