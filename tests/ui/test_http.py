"""The ui over HTTP: read-only, token-guarded when asked, clear errors for bad requests, and the
command line refusing a non-loopback bind without a token."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.ui.server import UiServer, serve_beside

from .conftest import Run, record_rollouts

pytestmark = pytest.mark.slow  # the session's run is traced and trained first


def test_bad_requests_get_400_naming_the_problem(ui: UiServer) -> None:
    base = f"http://127.0.0.1:{ui.port}"
    r = httpx.get(base + "/rollouts?sort=password")
    assert r.status_code == 400 and "cannot sort by &#39;password&#39;" in r.text
    r = httpx.get(base + "/api/rollouts?per_page=7")
    assert r.status_code == 400 and "page size must be one of" in r.json()["error"]
    assert httpx.get(base + "/rollouts/no-such-rollout").status_code == 404
    assert httpx.get(base + "/rollouts/x?policy=random").status_code in (400, 404)
    # read-only: nothing but GET
    assert httpx.post(base + "/rollouts", content=b"x").status_code == 405
    assert httpx.get(base + "/api/status").json()["rollouts"] > 0  # still serving


def test_api_rollouts_pages_in_the_requested_order(run: Run, ui: UiServer) -> None:
    base = f"http://127.0.0.1:{ui.port}"
    body = httpx.get(base + "/api/rollouts", params={"sort": "turns", "order": "desc", "per_page": 25}).json()
    assert body["rows"][0]["turns"] == 3  # the split-task rollouts made three calls
    turns = [r["turns"] for r in body["rows"]]
    assert turns == sorted(turns, reverse=True)


def test_token_guards_every_request_when_set(run: Run) -> None:
    with UiServer([run.root], token="s3cret-token") as server:
        base = f"http://127.0.0.1:{server.port}"
        assert httpx.get(base + "/").status_code == 401
        assert httpx.get(base + "/static/app.js").status_code == 401
        assert httpx.get(base + "/", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(base + "/", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        with httpx.Client(base_url=base) as client:  # the printed URL once, then the cookie
            assert client.get("/?token=s3cret-token").status_code == 200
            assert client.get("/api/status").status_code == 200
        assert server.url.endswith("/?token=s3cret-token")


def test_command_refuses_a_public_bind_without_a_token(run: Run) -> None:
    result = CliRunner().invoke(
        app, ["ui", str(run.root), "--host", "0.0.0.0"], env={"TINKERTRACE_UI_TOKEN": ""}
    )
    assert result.exit_code == 2
    assert "needs --token" in result.output


def test_ui_beside_a_run_that_has_not_started_follows_it(run: Run, tmp_path: Path) -> None:
    """What `demo --ui` does: serve a folder before the run writes anything, then follow it."""
    folder = tmp_path / "later"
    with serve_beside(folder, port=0) as url:
        status = httpx.get(url + "api/status").json()
        assert status["rollouts"] == 0
        record_rollouts(folder / "spans", run.server)
        deadline = time.monotonic() + 30
        while httpx.get(url + "api/status").json()["rollouts"] != 27 + 5:
            assert time.monotonic() < deadline, "the new rollouts never appeared"
            time.sleep(0.1)
    assert "--ui" in CliRunner().invoke(app, ["demo", "--help"]).output
