"""Staleness-aware admission: the endpoint starts only the rollouts the trainer will train.

An agent traced by tinkertrace sends its rollout id with every LLM call
(``x-tinkertrace-rollout-id``), and its task id (``x-tinkertrace-task-id``). The *first* call of a new
rollout is admitted only while the rollouts that were started but not yet consumed by the trainer fit
in what the trainer will consume before they go stale: ``rollouts_per_step × (max_staleness + 1)``
(the trainer states both, its *demand*). Later calls of an admitted rollout always pass, so no
rollout waits on itself.

The trainer trains whole groups (the rollouts of one task id), so the gate admits whole groups: with
the demand's ``group_size`` above 1, the first rollout of a task is admitted only when there is room
for its whole group, which it reserves; the rest of the group then passes at once, up to
``group_size`` (a rollout past that starts a new group). Admitting rollout by rollout split groups
across policy versions: part of a group started on one version, the rest (held) on the next, and
the trainer could train neither part in time. A group's unfilled places are given back once the
trainer consumed any of it (later rollouts of the task are a new group).

A held call waits at the endpoint, in arrival order, for as long as the demand holds: the client
sees latency, never an error. A demand is a lease: it lapses ``lease_s`` after the trainer was last
heard from (it stated its demand or consumed), and the trainer renews it while it runs
(:func:`tinkertrace.online.publish.demand_stated`). So a held call waits for a live trainer however
slow its steps (a fixed wait limit let calls through to rollouts that were then too old to train),
and is released within ``lease_s`` of a trainer that died without withdrawing (counted as
``lapsed``). The trainer reports each step's trained and dropped rollouts
(:meth:`AdmissionGate.consume`), which frees their places; a rollout the trainer never reports (its
agent died) gives its place back after ``expire_s``. Until a demand is stated, after it is
withdrawn or has lapsed, and for calls without a rollout id, everything passes.

The gate is shared between the event loop that serves requests and the trainer's thread: its state
sits under one lock, and waiting requests poll it briefly (no cross-thread wake-ups to get wrong).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

DEFAULT_LEASE_S = 30.0  # a demand not renewed (or no rollout consumed) this long lapses


@dataclass(frozen=True)
class Demand:
    """What the trainer consumes: rollouts per step, how many versions old a rollout may be, the
    rollouts of one group (admitted together; 1: rollout by rollout), and how long the demand holds
    without word from the trainer (``lease_s``)."""

    rollouts_per_step: int
    max_staleness: int
    group_size: int = 1
    lease_s: float = DEFAULT_LEASE_S

    def __post_init__(self) -> None:
        if self.rollouts_per_step < 1 or self.max_staleness < 0 or self.group_size < 1:
            raise ValueError(
                "rollouts_per_step and group_size must be at least 1 and max_staleness 0 or more"
            )
        if not 0 < self.lease_s < float("inf"):
            raise ValueError(f"lease_s must be a number of seconds above 0, not {self.lease_s}")

    def for_steps_left(self, steps: int) -> Demand:
        """This demand near the end of a run with ``steps`` steps left: no more rollouts in flight
        than those steps will train (the bound shrinks to ``steps - 1``), so none is sampled only to
        be left untrained when the run stops."""
        return replace(self, max_staleness=max(0, min(self.max_staleness, steps - 1)))

    @property
    def capacity(self) -> int:
        """Rollouts that may be started and not yet consumed at once."""
        return self.rollouts_per_step * (self.max_staleness + 1)

    @property
    def group_places(self) -> int:
        """Places a new group reserves (never more than the capacity, so every group can start)."""
        return max(1, min(self.group_size, self.capacity))


@dataclass(eq=False)
class _Group:
    """The admitted rollouts of one task id: ``places`` reserved, ``admitted`` so far; it takes more
    rollouts (``accepting``) until full or until the trainer consumed one of them."""

    places: int
    opened: float
    admitted: int = 0
    accepting: bool = True

    @property
    def unfilled(self) -> int:
        return self.places - self.admitted if self.accepting else 0


class AdmissionGate:
    """Admits new rollouts while the trainer's demand has room (see the module docstring)."""

    def __init__(
        self,
        *,
        poll_s: float = 0.02,
        expire_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.poll_s = poll_s
        self.expire_s = expire_s
        self.clock = clock
        self.demand: Demand | None = None
        self._heard = clock()  # when the trainer last stated its demand or consumed
        self.last_demand: Demand | None = None  # kept after a withdrawal, for the figures
        self._lock = threading.Lock()
        self._open: dict[str, float] = {}  # admitted rollout id -> when
        self._groups: dict[str, _Group] = {}  # task id -> its group taking rollouts now
        self._group_of: dict[str, _Group] = {}  # admitted rollout id -> its group
        self._queue: deque[int] = deque()  # tickets of held first calls, in arrival order
        self._tickets = itertools.count()
        self.admitted = 0  # rollouts admitted (first calls)
        self.held = 0  # of those, how many had to wait
        self.lapsed = 0  # demands that lapsed (the trainer went silent without withdrawing)
        self.consumed = 0  # rollouts the trainer reported trained or dropped
        self.expired = 0  # rollouts whose place was given back without a report
        self._waits: deque[float] = deque(maxlen=4096)

    # --- the trainer's side ------------------------------------------------------------------------
    def set_demand(self, demand: Demand) -> None:
        """State, change or renew what the trainer consumes; the gate is open until this is called,
        and again once ``demand.lease_s`` passed without the trainer stating it or consuming."""
        with self._lock:
            self.demand = self.last_demand = demand
            self._heard = self.clock()

    def withdraw(self) -> None:
        """The trainer stopped consuming: open the gate (held calls pass at once)."""
        with self._lock:
            self.demand = None

    def consume(self, rollout_ids: Iterable[str]) -> None:
        """The trainer has trained or dropped ``rollout_ids``: free their places (and those of
        rollouts admitted more than ``expire_s`` ago)."""
        with self._lock:
            self._heard = self.clock()
            for rid in rollout_ids:
                if self._open.pop(rid, None) is not None:
                    self.consumed += 1
                if (group := self._group_of.pop(rid, None)) is not None:
                    group.accepting = False  # the trainer took part of it: the rest is a new group
            horizon = self.clock() - self.expire_s
            gone = [rid for rid, at in self._open.items() if at < horizon]
            for rid in gone:
                del self._open[rid]
                self._group_of.pop(rid, None)
            self.expired += len(gone)
            for task, group in list(self._groups.items()):
                if not group.accepting or group.opened < horizon:
                    del self._groups[task]

    def _live_demand(self) -> Demand | None:
        """The demand, unless it lapsed (then the gate opens: the trainer is gone)."""
        if self.demand is not None and self.clock() - self._heard > self.demand.lease_s:
            self.demand = None
            self.lapsed += 1
        return self.demand

    def _reserved(self) -> int:
        """Places open groups hold for rollouts of theirs not yet started."""
        return sum(group.unfilled for group in self._groups.values())

    def _used(self) -> int:
        """Places taken: admitted rollouts not yet consumed, and the places open groups reserve."""
        return len(self._open) + self._reserved()

    def _enter(self, rollout_id: str, task_id: str | None) -> None:
        """Admit ``rollout_id`` (of ``task_id``'s group, opened here when it has none taking more)."""
        now = self.clock()
        self._open[rollout_id] = now
        self.admitted += 1
        demand = self.demand
        if not task_id or demand is None or demand.group_places == 1:  # rollout by rollout
            return
        group = self._groups.get(task_id)
        if group is None or not group.accepting:
            group = self._groups[task_id] = _Group(demand.group_places, now)
        group.admitted += 1
        group.accepting = group.admitted < group.places
        self._group_of[rollout_id] = group

    # --- the endpoint's side -----------------------------------------------------------------------
    def _try_admit(self, rollout_id: str, task_id: str | None, ticket: int | None) -> bool:
        """Admit ``rollout_id`` if it is open already, if its group has a place reserved for it, or
        if there is room (for its whole group) and no earlier waiter."""
        with self._lock:
            if rollout_id in self._open:
                return True
            group = self._groups.get(task_id) if task_id else None
            reserved = group is not None and group.accepting
            # an open gate (no demand) lets everyone through, and so does a group's reserved place;
            # else a newcomer (ticket None) goes only if none wait, a waiter only at the head of the
            # line, and only while there is room for its group
            demand = self._live_demand()
            if demand is not None and not reserved:
                head = self._queue[0] if self._queue else None
                places = demand.group_places if task_id else 1
                if head != ticket or self._used() + places > demand.capacity:
                    return False
            self._enter(rollout_id, task_id)
            if ticket is not None:
                self._queue.remove(ticket)
            return True

    async def admit(self, rollout_id: str | None, task_id: str | None = None) -> float:
        """Wait until the call of ``rollout_id`` (of task ``task_id``'s group) may be sampled; returns
        the seconds waited (as long as the demand holds). Never raises for capacity."""
        if not rollout_id or self._try_admit(rollout_id, task_id, None):
            return 0.0
        started = self.clock()
        with self._lock:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            self.held += 1
        try:
            while not self._try_admit(rollout_id, task_id, ticket):
                await asyncio.sleep(self.poll_s)
        except BaseException:  # the client went away while held: leave the line
            with self._lock, contextlib.suppress(ValueError):
                self._queue.remove(ticket)
            raise
        waited = self.clock() - started
        self._waits.append(waited)
        return waited

    def stats(self) -> dict[str, Any]:
        """Counts and wait times (seconds) of held first calls, for /health and the demo summary.
        ``enabled``: a demand holds now; the demand figures are the last one stated."""
        with self._lock:
            self._live_demand()
            waits = np.asarray(self._waits, dtype=np.float64)
            demand = self.last_demand
            return {
                "enabled": self.demand is not None,
                "capacity": demand.capacity if demand else None,
                "rollouts_per_step": demand.rollouts_per_step if demand else None,
                "max_staleness": demand.max_staleness if demand else None,
                "group_size": demand.group_size if demand else None,
                "lease_s": demand.lease_s if demand else None,
                "open": len(self._open),
                "reserved": self._reserved(),
                "waiting": len(self._queue),
                "admitted": self.admitted,
                "held": self.held,
                "lapsed": self.lapsed,
                "consumed": self.consumed,
                "expired": self.expired,
                "wait_p50_s": float(np.percentile(waits, 50)) if waits.size else 0.0,
                "wait_p95_s": float(np.percentile(waits, 95)) if waits.size else 0.0,
                "wait_max_s": float(waits.max()) if waits.size else 0.0,
            }
