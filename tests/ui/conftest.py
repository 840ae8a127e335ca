"""A real run for the ui tests, built in the session: traced rollouts (SDK, real OpenAI client, the
test server) into a spans folder, a batch training run on them (metrics, checkpoints, built tables),
the ui serving that folder, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

import tinkertrace
from tinkertrace import schemas
from tinkertrace.models.builtin import BUILTIN_MODEL
from tinkertrace.testing.openai_server import RunningServer
from tinkertrace.training.config import make_config
from tinkertrace.training.loop import run_training
from tinkertrace.ui.server import UiServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCRIPT_TEXT = "<script>window.__pwned = 1</script><b>not bold</b>"
TASKS = 9  # x 3 attempts: 27 single-turn rollouts, more than one page of 25


@dataclass
class Run:
    root: Path
    spans: Path
    log_dir: Path
    split_rollout: str  # its prompt history changed mid-conversation: two segments
    script_rollout: str  # a user message holding HTML
    unmatched_rollout: str  # a reward emitted before any call
    retokenized_rollout: str  # the server returned no ids: the SDK re-tokenised
    server: RunningServer

    def agent(self) -> Agent:
        return Agent(openai.OpenAI(base_url=self.server.base_url, api_key="test"))


@dataclass
class Agent:
    client: openai.OpenAI

    def chat(self, messages: list[dict[str, Any]]) -> str:
        reply = self.client.chat.completions.create(model=BUILTIN_MODEL, messages=messages)
        return reply.choices[0].message.content or ""


def rollout_id() -> str:
    from tinkertrace.sdk.context import current_rollout

    return current_rollout().rollout_id  # type: ignore[union-attr]


def record_rollouts(spans: Path, server: RunningServer) -> dict[str, str]:
    """Trace the fixture's rollouts into ``spans``; the ids of the special ones."""
    tinkertrace.init(spans_dir=spans, tokenizer=BUILTIN_MODEL)
    agent = Agent(openai.OpenAI(base_url=server.base_url, api_key="test"))
    special: dict[str, str] = {}

    @tinkertrace.traced_rollout
    def simple(task: dict[str, Any]) -> float:
        agent.chat([{"role": "user", "content": task["q"]}])
        return float(task["reward"])

    @tinkertrace.traced_rollout
    def edits_history(task: dict[str, Any]) -> None:
        special["split"] = rollout_id()
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}]
        reply = agent.chat(msgs)
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "y"}]
        reply = agent.chat(msgs)
        msgs[0] = {"role": "system", "content": "be verbose"}  # the history changed: a new segment
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "z"}]
        agent.chat(msgs)
        tinkertrace.emit_reward(float(task["reward"]))

    @tinkertrace.traced_rollout
    def html(task: dict[str, Any]) -> float:
        special["script"] = rollout_id()
        agent.chat([{"role": "user", "content": SCRIPT_TEXT}])
        return 0.5

    @tinkertrace.traced_rollout
    def early_reward(task: dict[str, Any]) -> None:
        special["unmatched"] = rollout_id()
        tinkertrace.emit_reward(0.25)  # before any call: nothing to land on
        agent.chat([{"role": "user", "content": "late"}])
        tinkertrace.emit_reward(0.75)

    @tinkertrace.traced_rollout
    def no_server_ids(task: dict[str, Any]) -> float:
        special["retokenized"] = rollout_id()
        server.server.options.token_ids = False
        try:
            agent.chat([{"role": "user", "content": "ids please"}])
        finally:
            server.server.options.token_ids = True
        return 1.0

    try:
        for t in range(TASKS):
            for k in range(3):
                simple({"id": f"task-{t}", "q": f"question {t}", "reward": (t + k) % 2})
        edits_history({"id": "split-task", "reward": 1.0})
        edits_history({"id": "split-task", "reward": 0.0})  # the last one's id is kept: reward 0
        html({"id": "html-task"})
        early_reward({"id": "early-task"})
        no_server_ids({"id": "retok-task"})
        tinkertrace.flush()
    finally:
        tinkertrace.shutdown()
    return special


@pytest.fixture(scope="session")
def run(tmp_path_factory: pytest.TempPathFactory, _openai_server_session: RunningServer) -> Run:
    root = tmp_path_factory.mktemp("ui-run")
    spans, log_dir = root / "spans", root / "train"
    special = record_rollouts(spans, _openai_server_session)
    config = make_config(
        None,
        {
            "source": spans,
            "model": f"{BUILTIN_MODEL}:nano",
            "groups_per_batch": 2,
            "lora_rank": 4,
            "log_dir": log_dir,
            "engine_dir": root / "engine",
            "save_every": 1,
        },
    )
    run_training(config, progress=False)
    return Run(
        root, spans, log_dir, special["split"], special["script"], special["unmatched"],
        special["retokenized"], _openai_server_session,
    )  # fmt: skip


@pytest.fixture(scope="session")
def ui(run: Run) -> Iterator[UiServer]:
    with UiServer([run.root], refresh_s=0.2) as server:
        yield server


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Debian's chromium, for the ui package's tests only: Playwright's sync API keeps an event loop running
    on the main thread while it is open, which would break ``asyncio.run`` in every test after it."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (make browser installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_page(browser: Any, viewport: dict[str, int]) -> Iterator[Any]:
    """A fresh page of ``viewport`` size (a fixture's body); JavaScript errors on it fail the test."""
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(15_000)
    yield page
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh 1300x900 page; JavaScript errors on it fail the test."""
    yield from open_page(browser, {"width": 1300, "height": 900})


T0 = 1_700_000_000_000_000_000


def span(trace: str, sid: str, name: str, at: float, parent: str | None = None, **cols: Any) -> dict:
    """One row of the spans schema: ids padded, times in seconds after T0, JSON columns from dicts."""
    row: dict[str, Any] = {f.name: None for f in schemas.spans()}
    row.update(trace_id=trace.rjust(32, "0"), span_id=sid.rjust(16, "0"), name=name, kind="INTERNAL",
               parent_span_id=parent.rjust(16, "0") if parent else None, start_time=T0 + int(at * 1e9),
               end_time=T0 + int((at + 1) * 1e9), status_code="UNSET", received_at=T0 + int((at + 2) * 1e9),
               attributes="{}", resource_attributes="{}", events="[]", links="[]")  # fmt: skip
    for key in ("attributes", "resource_attributes"):
        if isinstance(cols.get(key), dict):
            cols[key] = json.dumps(cols[key])
    row.update(cols)
    return row


def rollout_spans(rid: str, trace: str, task: str, version: int, reward: float) -> list[dict]:
    """One succeeded rollout in our SDK's span form: its root, one LLM call sampled by policy
    ``version``, and its ``reward``."""
    ids = {"rollout_id": rid, "task_id": task}
    return [
        span(trace, "1", "rollout", 0, span_type="rollout", **ids,
             attributes={"tinkertrace.rollout.status": "succeeded"}),
        span(trace, "2", "chat", 1, parent="1", span_type="llm", policy_version=version,
             prompt_token_ids=[1, 2], response_token_ids=[3], **ids),
        span(trace, "3", "reward", 2, parent="1", span_type="reward", reward_value=reward, **ids),
    ]  # fmt: skip
