"""A live online stack for the follow-mode tests: real collector subprocess, real endpoint."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from openai import OpenAI

import tinkertrace
from tinkertrace.online.demo_agent import introduce
from tinkertrace.online.runner import OnlineStack
from tinkertrace.online.settings import StackSettings
from tinkertrace.spanstore.reader import list_span_files

MODEL = "tinkertrace/tiny-chat:nano"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnlineStack]:
    out = tmp_path_factory.mktemp("online")
    with OnlineStack(StackSettings(out=out, model=MODEL, group_size=4, max_tokens=6)) as running:
        tinkertrace.init(endpoint=running.collector_url, schedule_delay_s=0.05)
        yield running
        tinkertrace.shutdown()


def make_rollouts(stack: OnlineStack, prefix: str, groups: int, size: int = 4) -> set[str]:
    """Run ``groups`` × ``size`` traced identity rollouts; wait until their spans are in files.
    Returns the task ids."""
    client = OpenAI(base_url=stack.base_url, api_key="EMPTY")
    tasks = [{"id": f"{prefix}-{g}", "question": "Who are you?"} for g in range(groups)]
    before = len(list_span_files(stack.settings.spans_dir))
    for task in tasks:
        for _ in range(size):
            introduce(task, client=client, model=MODEL, max_tokens=6)
    assert tinkertrace.flush()
    wait_for(lambda: len(list_span_files(stack.settings.spans_dir)) > before, 20)
    time.sleep(1.0)  # one more roll of the collector
    return {t["id"] for t in tasks}


def wait_for(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.1)


@pytest.fixture
def engine_dir(stack: OnlineStack) -> Path:
    return stack.settings.engine_dir
