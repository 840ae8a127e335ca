"""``init()`` imports no HTTP library: one the agent imports afterwards is patched on import, and its
calls are captured like any other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb

from tinkertrace.testing.openai_server import RunningServer

AGENT = """
import sys
import tinkertrace
tinkertrace.init(spans_dir=sys.argv[2])
print("httpx imported by init:", "httpx" in sys.modules)
import openai  # imports httpx now: the import hook patches it

@tinkertrace.traced_rollout
def agent() -> None:
    client = openai.OpenAI(base_url=sys.argv[1], api_key="EMPTY")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)

agent()
tinkertrace.shutdown()
"""


def test_a_library_imported_after_init_is_patched_on_import(
    openai_server: RunningServer, tmp_path: Path
) -> None:
    spans = tmp_path / "spans"
    done = subprocess.run(
        [sys.executable, "-c", AGENT, openai_server.base_url, str(spans)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "httpx imported by init: False" in done.stdout
    rows = duckdb.sql(
        f"SELECT len(prompt_token_ids), len(response_token_ids) FROM read_parquet('{spans}/**/*.parquet') "
        "WHERE span_type = 'llm'"
    ).fetchall()
    assert len(rows) == 1 and rows[0][0] > 0 and rows[0][1] > 0


EXPORTER = """
import sys
import tinkertrace
tinkertrace.init(endpoint=sys.argv[1], spool_dir=sys.argv[2])

@tinkertrace.traced_rollout
def agent() -> None:
    tinkertrace.emit_reward(1.0)

agent()
tinkertrace.shutdown()  # the batch was sent (the test server answers 404: refused, kept in rejected/)
print("httpx imported:", "httpx" in sys.modules)
"""


def test_the_otlp_exporter_never_imports_httpx(openai_server: RunningServer, tmp_path: Path) -> None:
    """The exporter sends with http.client: the agent's threads never meet a half-imported httpx."""
    root = openai_server.base_url.rsplit("/v1", 1)[0]
    done = subprocess.run(
        [sys.executable, "-c", EXPORTER, root, str(tmp_path / "spool")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "httpx imported: False" in done.stdout
    assert [p for p in (tmp_path / "spool" / "rejected").rglob("*") if p.is_file()]  # sent, and refused
