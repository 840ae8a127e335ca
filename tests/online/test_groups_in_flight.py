"""The agent workers' group loop (``online.groups_in_flight.run_groups``) in a real process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tinkertrace.testing.signals import CAN_SIGNAL_THREADS, signal_other_thread

WORKER = """
import signal, sys, threading, time
from tinkertrace.online.groups_in_flight import run_groups
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
started = []
def next_group():
    started.append(len(started))
    return started[-1]
def run_group(group):
    if group == 1:
        print("running", flush=True)
    time.sleep(0.2)
run_groups(next_group, run_group, stop)
print("groups", len(started), flush=True)
"""


@pytest.mark.skipif(not CAN_SIGNAL_THREADS, reason="Linux's tgkill")
def test_a_sigterm_a_group_thread_receives_ends_the_worker() -> None:
    """The kernel may hand the worker's SIGTERM to a group's thread; the main thread, waiting for the
    groups, still wakes to run the handler, and the groups in flight finish."""
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None and worker.stdout.readline() == "running\n"
    time.sleep(0.3)
    signal_other_thread(worker.pid, signal.SIGTERM)
    output, _ = worker.communicate(timeout=10)
    assert worker.returncode == 0 and output.startswith("groups ")
