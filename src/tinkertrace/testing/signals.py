"""Signalling one thread of another process, as the kernel may when it delivers a process's signal.

Python runs signal handlers in the main thread only, when that thread runs; a server whose main
thread waits without a timeout never sees a SIGTERM that one of its other threads received. Tests
send such a signal with :func:`signal_other_thread` (Linux's ``tgkill``).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

TGKILL = {"x86_64": 234, "aarch64": 131}  # the syscall's number, by machine
CAN_SIGNAL_THREADS = os.uname().machine in TGKILL and Path("/proc/self/task").exists()


def signal_other_thread(pid: int, signum: int) -> int:
    """Send ``signum`` to one thread of process ``pid`` that is not its main thread; that thread's id.
    AssertionError when the process runs no other thread."""
    others = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
    assert others, f"process {pid} runs no thread besides its main one"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(TGKILL[os.uname().machine], pid, others[-1], signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {others[-1]}, {signum}) failed")
    return others[-1]
