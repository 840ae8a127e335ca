"""A folder of OTLP request payloads that could not be delivered yet, oldest first, shared safely by
every process that exports to the same endpoint.

Each file is one serialized ``ExportTraceServiceRequest`` named ``<time_ns>-<pid>-<seq>-n<spans>.otlp``,
written under a temporary name, fsynced and renamed, the folder fsynced after each rename
(:func:`tinkertrace.durable.durable_rename`), so neither a crash nor a power loss leaves a half file
that looks whole or undoes a rename.

Several agent processes may share one spool folder. Before re-sending a payload a process *claims* it by
renaming it to ``<name>.claim-<host>-<pid>`` (a rename succeeds for exactly one process), so each
spooled batch is re-sent by one process at a time and never after another delivered it (a send that got
no answer may still have been stored: see :mod:`tinkertrace.sdk.otlp`). A claim is released (renamed
back) when the endpoint is still unreachable; a claim left by a process that died is released by the
next process that looks (same host: its pid is gone; another host: older than :data:`STALE_CLAIM_S`).
Payloads the endpoint refused as invalid are kept in ``rejected/`` for inspection (moved back into the
folder, they are sent again).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from pathlib import Path

from tinkertrace.durable import durable_rename

SUFFIX = ".otlp"
CLAIM = ".claim-"
STALE_CLAIM_S = 300.0  # another host's claim older than this is released (sends take seconds)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spool:
    """Put payloads, list them oldest first, claim, release, finish or reject them."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rejected_dir = self.root / "rejected"
        self.rejected_dir.mkdir(exist_ok=True)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._claim_suffix = f"{CLAIM}{socket.gethostname()}-{os.getpid()}"

    def _name(self, n_spans: int) -> str:
        with self._lock:
            return f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}-n{n_spans}{SUFFIX}"

    @staticmethod
    def _write(final: Path, payload: bytes) -> Path:
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        return durable_rename(tmp, final, synced=True)

    def put(self, payload: bytes, n_spans: int) -> Path:
        """Keep a payload to be re-sent."""
        return self._write(self.root / self._name(n_spans), payload)

    def put_rejected(self, payload: bytes, n_spans: int) -> Path:
        """Keep a payload the endpoint refused on its first try (never re-sent by itself)."""
        return self._write(self.rejected_dir / self._name(n_spans), payload)

    def pending(self) -> list[Path]:
        """Unclaimed payloads, oldest first."""
        return sorted(self.root.glob("*" + SUFFIX))

    def claim(self, path: Path) -> Path | None:
        """Take ``path`` for this process; None if another process took it (or it is gone)."""
        claimed = path.with_name(path.name + self._claim_suffix)
        try:
            durable_rename(path, claimed)
            os.utime(claimed)  # the claim's age counts from now (see release_stale_claims)
        except FileNotFoundError:
            return None
        return claimed

    @staticmethod
    def original(claimed: Path) -> Path:
        return claimed.with_name(claimed.name.split(CLAIM, 1)[0])

    def release(self, claimed: Path) -> None:
        """Give a claimed payload back (the endpoint could not take it now)."""
        durable_rename(claimed, self.original(claimed))

    def reject(self, claimed: Path) -> None:
        """Keep a payload the endpoint refused as invalid aside for inspection (never re-sent)."""
        durable_rename(claimed, self.rejected_dir / self.original(claimed).name)

    def release_stale_claims(self) -> int:
        """Release claims whose process is gone (this host) or that are older than STALE_CLAIM_S."""
        host, released = socket.gethostname(), 0
        for claimed in self.root.glob(f"*{SUFFIX}{CLAIM}*"):
            owner = claimed.name.split(CLAIM, 1)[1]
            owner_host, _, pid = owner.rpartition("-")
            try:
                stat = claimed.stat()
                age = time.time() - max(stat.st_mtime, stat.st_ctime)  # a rename sets ctime
                if owner_host == host:
                    stale = pid.isdigit() and not _pid_alive(int(pid))
                else:
                    stale = age > STALE_CLAIM_S
                if stale:
                    durable_rename(claimed, self.original(claimed))
                    released += 1
            except FileNotFoundError:
                continue  # its owner finished with it meanwhile
        return released

    @staticmethod
    def span_count(path: Path) -> int:
        try:
            return int(Spool.original(path).stem.rsplit("-n", 1)[1])
        except (IndexError, ValueError):
            return 0
