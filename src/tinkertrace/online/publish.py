"""Where the follow trainer publishes: its demand before the first step, then each new version.

:class:`AdminPublisher` talks to a ``tinkertrace serve`` in another process through its admin API;
:class:`HolderPublisher` to an endpoint served in this process (``serving.policy.PolicyHolder``).
Both feed the endpoint's admission gate (:mod:`tinkertrace.serving.admission`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol


class Publisher(Protocol):
    """Where the follow trainer states its demand and publishes each new policy version."""

    def demand(self, rollouts_per_step: int, max_staleness: int) -> None:
        """Before the first step: what the trainer consumes (the endpoint admits rollouts by it)."""

    def publish(self, record: dict[str, Any]) -> None:
        """A new version (a checkpoint record with its trained and dropped rollout ids)."""

    def withdraw(self) -> None:
        """The trainer stopped: the endpoint no longer holds new rollouts for it."""


def consumed_ids(record: dict[str, Any]) -> list[str]:
    """The rollouts a checkpoint record consumed: trained or dropped."""
    return [*record.get("trained_rollout_ids", []), *record.get("dropped_rollout_ids", [])]


@dataclass
class AdminPublisher:
    """Publish through a sampling endpoint's admin API (``tinkertrace serve --admin-token``):
    ``POST /admin/policy`` swaps the weights, ``POST /admin/admission`` feeds its admission gate."""

    url: str
    token: str | None = None

    def _post(self, path: str, body: dict[str, Any], ok: tuple[int, ...] = (200,)) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = httpx.post(self.url.rstrip("/") + path, json=body, headers=headers, timeout=60)
        if response.status_code not in ok:
            raise RuntimeError(
                f"publishing to {self.url}{path} failed: HTTP {response.status_code} {response.text[:200]}"
            )

    def demand(self, rollouts_per_step: int, max_staleness: int) -> None:
        body = {"rollouts_per_step": rollouts_per_step, "max_staleness": max_staleness}
        self._post("/admin/admission", body)

    def withdraw(self) -> None:
        import httpx

        with suppress(httpx.HTTPError, RuntimeError):  # an endpoint that is gone holds nothing back
            self._post("/admin/admission", {"withdraw": True})

    def publish(self, record: dict[str, Any]) -> None:
        body = {"model_path": record["sampler_path"], "version": record["policy_version"]}
        self._post("/admin/policy", body, ok=(200, 409))  # 409: that version or newer is served already
        self._post("/admin/admission", {"rollout_ids": consumed_ids(record)})


@dataclass
class HolderPublisher:
    """Publish into an in-process ``serving.policy.PolicyHolder`` (swap without dropping requests)
    and its admission gate."""

    holder: Any

    def demand(self, rollouts_per_step: int, max_staleness: int) -> None:
        self.holder.admission.set_demand(rollouts_per_step, max_staleness)

    def withdraw(self) -> None:
        self.holder.admission.withdraw()

    def publish(self, record: dict[str, Any]) -> None:
        from tinkertrace.serving.policy import StalePolicyError

        with suppress(StalePolicyError):
            self.holder.load(record["sampler_path"], record["policy_version"])
        self.holder.admission.consume(consumed_ids(record))


def admin_publisher(url: str, token: str | None) -> Publisher:
    """A :class:`Publisher` for a `tinkertrace serve` in another process."""
    return AdminPublisher(url, token)


def holder_publisher(holder: Any) -> Publisher:
    """A :class:`Publisher` for an endpoint served in this process."""
    return HolderPublisher(holder)


@contextmanager
def demand_stated(
    publish: Publisher | None, rollouts_per_step: int, max_staleness: int | None
) -> Iterator[None]:
    """While training: the endpoint ``publish`` reaches starts only the rollouts the trainer will take
    within ``max_staleness`` versions (its admission gate); withdrawn when the run ends. Nothing
    without a publisher or a bound."""
    if publish is None or max_staleness is None:
        yield
        return
    publish.demand(rollouts_per_step, max_staleness)
    try:
        yield
    finally:
        publish.withdraw()
