"""The ui never breaks and never stays silent: bad parameters are 400s naming them, folders without
spans say so, skipped files are on the page, flat span folders work (in the pages and in
`tinkertrace build-trajectories`), an empty token and a taken port are one clear line each, and
values the run writes later appear without a reload."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.ui.server import UiServer

from .conftest import Run

pytestmark = pytest.mark.slow  # the session's run is traced and trained first


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("page=99999999999999999999", "page must be a whole number from 1 to"),
        ("order=sideways", "order must be asc or desc, got 'sideways'"),
        ("trained=2", "trained must be 0 or 1, got '2'"),
        ("outcome=lucky", "outcome must be one of trained, dropped, stale"),
        ("colour=red", "unknown parameter 'colour'"),
        ("page=12", "page 12 is past the last page (2) of this list"),
    ],
)
def test_bad_list_parameters_are_400s_naming_them(ui: UiServer, query: str, message: str) -> None:
    base = f"http://127.0.0.1:{ui.port}"
    api = httpx.get(f"{base}/api/rollouts?per_page=25&{query}")
    assert api.status_code == 400 and message in api.json()["error"]
    html = httpx.get(f"{base}/rollouts?per_page=25&{query}")
    assert html.status_code == 400 and message.replace("'", "&#39;") in html.text


def _flat_copy(run: Run, to: Path, keep_partitions: int = 0) -> Path:
    """The run's span files in ``to`` directly (no date=/hour= folders), but the first
    ``keep_partitions`` files, which keep theirs (a mixed folder)."""
    files = sorted(run.spans.rglob("*.parquet"))
    for i, path in enumerate(files):
        target = to / path.relative_to(run.spans) if i < keep_partitions else to / f"flat-{i}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return to


def test_flat_and_mixed_span_folders_work_in_the_pages_and_the_build(
    run: Run, tmp_path: Path, page: Any
) -> None:
    flat = _flat_copy(run, tmp_path / "flat" / "spans")
    mixed = _flat_copy(run, tmp_path / "mixed", keep_partitions=1)
    built = pq.read_table(run.log_dir / "build" / "trajectories.parquet")
    for folder in (flat, mixed):
        out = tmp_path / f"built-{folder.name}"
        result = CliRunner().invoke(app, ["build-trajectories", str(folder), "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert pq.read_table(out / "trajectories.parquet").num_rows == built.num_rows
    with UiServer([flat.parent], refresh_s=0.2) as server:
        page.goto(server.url + f"rollouts/{run.split_rollout}")
        assert page.locator("#calls tbody tr").count() == 3
        page.goto(server.url + f"trajectory/{run.split_rollout}")
        rows = built.filter(pc.equal(built["rollout_id"], run.split_rollout)).select(["tokens"]).to_pylist()
        assert page.locator("#token-count").inner_text() == str(sum(len(r["tokens"]) for r in rows))
        page.goto(server.url + "build")
        page.locator("#unmatched-count").wait_for(timeout=60_000)
        assert "hive" not in page.content().lower()


def test_folders_without_spans_say_so_and_skipped_files_are_listed(tmp_path: Path, page: Any) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.csv").write_text("a,b\n1,2\n")
    duckdb.sql(f"COPY (SELECT 1 AS id, 'x' AS name) TO '{foreign / 'other.parquet'}'")
    for folder, shown in ((empty, None), (foreign, "other.parquet")):
        with UiServer([folder], refresh_s=0.2) as server:
            page.goto(server.url)
            assert page.locator("#no-spans").inner_text().startswith(f"no span files found in {folder}")
            if shown:
                row = page.locator("#skipped-files tbody tr").first.inner_text()
                assert shown in row and "not a spans file" in row
            page.goto(server.url + "rollouts")
            assert page.locator("#no-spans").count() == 1


def test_corrupt_span_files_are_listed_on_the_run_page(run: Run, tmp_path: Path, page: Any) -> None:
    spans = tmp_path / "run" / "spans"
    shutil.copytree(run.spans, spans)
    bad = next(spans.rglob("*.parquet")).with_name("broken.parquet")
    bad.write_bytes(b"PAR1 not really parquet")
    with UiServer([spans.parent], refresh_s=0.2) as server:
        page.goto(server.url)
        assert page.locator("#count-skipped").inner_text() == "1"
        row = page.locator("#skipped-files tbody tr").first.inner_text()
        assert "broken.parquet" in row and "unreadable Parquet" in row
        assert page.locator("#no-spans").count() == 0


def test_a_page_whose_server_stops_says_so_without_an_error(run: Run, page: Any) -> None:
    with UiServer([run.root], refresh_s=0.2) as server:
        page.goto(server.url)
    live = page.locator("#live.offline")
    live.wait_for(timeout=10_000)  # its next poll found no server; no uncaught "Failed to fetch"
    assert live.count() == 1


def test_a_summary_written_later_appears_without_a_reload(run: Run, tmp_path: Path, page: Any) -> None:
    root = tmp_path / "run"
    shutil.copytree(run.spans, root / "spans")
    shutil.copytree(run.log_dir, root / "train")
    with UiServer([root], refresh_s=0.2) as server:
        page.goto(server.url)
        assert page.locator("#summary").count() == 0
        summary = {"steps": 7, "rollouts_trained": 41, "reward": {"first": 0.123456789, "last": 0.5}}
        (root / "summary.json").write_text(json.dumps(summary))
        page.locator("#summary").wait_for(timeout=15_000)
        assert "41" in page.locator("#summary").inner_text()
        nested = page.locator("#summary table.nested")  # a table, not a Python dict's text
        assert nested.locator("th").all_inner_texts() == ["first", "last"]
        assert nested.locator("td").all_inner_texts() == ["0.1235", "0.5"]


def test_an_empty_token_is_refused_at_start(run: Run) -> None:
    result = CliRunner().invoke(app, ["ui", str(run.root), "--token", ""])
    assert result.exit_code == 2 and "token is empty" in result.output
    with pytest.raises(ValueError, match="empty token"):
        UiServer([run.root], token="")


def test_a_taken_port_is_one_line(run: Run) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["ui", str(run.root), "--port", str(port)])
    assert result.exit_code == 1
    line = f"error: cannot listen on 127.0.0.1:{port}: address already in use; choose another --port"
    assert result.output.strip().splitlines() == [line + " (0: a free one)"]
