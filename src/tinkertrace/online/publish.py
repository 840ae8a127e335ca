"""Where the follow trainer publishes: its demand before the first step, then each new version.

:class:`AdminPublisher` talks to a ``tinkertrace serve`` in another process through its admin API;
:class:`HolderPublisher` to an endpoint served in this process (``serving.policy.PolicyHolder``).
Both feed the endpoint's admission gate (:mod:`tinkertrace.serving.admission`).
:func:`publish_version` publishes a new version in the form the endpoint asks for
(``PolicyHolder.sampler_kind``): a sampler path, or a Tinker ``kind="inflight"`` sampling client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol

from tinkertrace.serving.admission import Demand
from tinkertrace.serving.policy import SamplerKind, StalePolicyError, resolve_client

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Where the follow trainer states its demand and publishes each new policy version."""

    def demand(self, demand: Demand) -> None:
        """What the trainer consumes (the endpoint admits rollouts by it, whole groups at a time);
        stated before the first step and re-stated within ``demand.lease_s`` to keep it (the
        endpoint drops a demand not heard of for that long)."""

    def sampler_kind(self) -> SamplerKind:
        """The form the endpoint takes new weights in (``PolicyHolder.sampler_kind``)."""

    def publish(self, record: dict[str, Any], sampling_client: Any = None) -> None:
        """A new version (a checkpoint record with its trained and dropped rollout ids); with
        ``sampling_client``, a Tinker inflight client of the record's weights to serve them."""

    def consume(self, rollout_ids: list[str]) -> None:
        """Rollouts the trainer dropped between steps (stale, or a batch of constant-reward groups):
        the endpoint frees their places now. A step's own go with its :meth:`publish`."""

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
    _kind: SamplerKind | None = None

    def _send(self, method: str, path: str, body: dict[str, Any] | None, ok: tuple[int, ...] = (200,)) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = self.url.rstrip("/") + path
        response = httpx.request(method, url, json=body, headers=headers, timeout=60)
        if response.status_code not in ok:
            raise RuntimeError(
                f"publishing to {self.url}{path} failed: HTTP {response.status_code} {response.text[:200]}"
            )
        return response

    def _post(self, path: str, body: dict[str, Any], ok: tuple[int, ...] = (200,)) -> None:
        self._send("POST", path, body, ok)

    def sampler_kind(self) -> SamplerKind:
        """What ``GET /admin/policy`` says (asked once); ``snapshot`` from an endpoint that does not say."""
        if self._kind is None:
            kind = self._send("GET", "/admin/policy", None).json().get("sampler_kind")
            self._kind = "inflight" if kind == "inflight" else "snapshot"
        return self._kind

    def demand(self, demand: Demand) -> None:
        body: dict[str, Any] = {
            "rollouts_per_step": demand.rollouts_per_step,
            "max_staleness": demand.max_staleness,
            "lease_s": demand.lease_s,
        }
        if demand.group_size > 1:  # an endpoint from before group admission refuses nothing it lacks
            body["group_size"] = demand.group_size
        self._post("/admin/admission", body)

    def consume(self, rollout_ids: list[str]) -> None:
        import httpx

        with suppress(httpx.HTTPError, RuntimeError):  # the next publication carries them again
            self._post("/admin/admission", {"rollout_ids": rollout_ids})

    def withdraw(self) -> None:
        import httpx

        with suppress(httpx.HTTPError, RuntimeError):  # an endpoint that is gone holds nothing back
            self._post("/admin/admission", {"withdraw": True})

    def publish(self, record: dict[str, Any], sampling_client: Any = None) -> None:
        body = {"model_path": record["sampler_path"], "version": record["policy_version"]}
        if sampling_client is not None:  # the endpoint opens it with its own Tinker key
            body["sampler_handle"] = sampling_client.get_sampler_handle()
        self._post("/admin/policy", body, ok=(200, 409))  # 409: that version or newer is served already
        self._post("/admin/admission", {"rollout_ids": consumed_ids(record)})


@dataclass
class HolderPublisher:
    """Publish into an in-process ``serving.policy.PolicyHolder`` (swap without dropping requests)
    and its admission gate."""

    holder: Any

    def demand(self, demand: Demand) -> None:
        self.holder.admission.set_demand(demand)

    def consume(self, rollout_ids: list[str]) -> None:
        self.holder.admission.consume(rollout_ids)

    def withdraw(self) -> None:
        self.holder.admission.withdraw()

    def sampler_kind(self) -> SamplerKind:
        return self.holder.sampler_kind

    def publish(self, record: dict[str, Any], sampling_client: Any = None) -> None:
        path, version = record["sampler_path"], record["policy_version"]
        with suppress(StalePolicyError):
            if sampling_client is not None:
                self.holder.swap(sampling_client, version, path, inflight=True)
            else:
                self.holder.load(path, version)
        self.consume(consumed_ids(record))


def publish_version(publish: Publisher, training_client: Any, record: dict[str, Any]) -> None:
    """Publish ``record`` (a checkpoint whose weights are ``training_client``'s now) in the form the
    endpoint takes: with ``"inflight"``, a Tinker ``kind="inflight"`` sampling client of those weights
    (the requests the endpoint is decoding continue on them; the record's snapshot path stays the
    policy's path), else the record's sampler path, loaded as a snapshot."""
    client = None
    if publish.sampler_kind() == "inflight":
        client = resolve_client(training_client.save_weights_and_get_sampling_client(kind="inflight"))
    publish.publish(record, client)


def hand_back(publish: Publisher, record: dict[str, Any] | None) -> str | None:
    """The trainer stops (before its session ends): an endpoint that took its inflight clients gets
    ``record``'s version (the last published) again as the snapshot at its path, for Tinker's inflight
    clients end with the session that made them while the endpoint goes on serving. A note when that
    failed (the run is ending: the failure must not hide why), else None."""
    try:
        if record is not None and publish.sampler_kind() == "inflight":
            publish.publish(record)
    except Exception as exc:  # reported as the run's note
        version = record["policy_version"] if record else None
        return f"could not hand version {version} back to the endpoint as a snapshot: {exc}"
    return None


def admin_publisher(url: str, token: str | None) -> Publisher:
    """A :class:`Publisher` for a `tinkertrace serve` in another process."""
    return AdminPublisher(url, token)


def holder_publisher(holder: Any) -> Publisher:
    """A :class:`Publisher` for an endpoint served in this process."""
    return HolderPublisher(holder)


@dataclass
class StatedDemand:
    """The demand a running trainer holds at its endpoint: :meth:`restate` changes it (sent at once),
    and the renewal sends the latest."""

    publish: Publisher
    demand: Demand

    def restate(self, demand: Demand) -> None:
        """Hold ``demand`` from now on."""
        if demand != self.demand:
            self.demand = demand
            self.publish.demand(demand)


@contextmanager
def demand_stated(publish: Publisher | None, demand: Demand | None) -> Iterator[StatedDemand | None]:
    """While training: the endpoint ``publish`` reaches starts only the rollouts the trainer will take
    in time (``demand``, for its admission gate; changed through the :class:`StatedDemand` yielded).
    The demand is renewed every ``lease_s / 3`` on a thread (so held calls wait however long a step
    takes, and an endpoint restarted meanwhile gets it back) and withdrawn when the run ends; if this
    process dies, the endpoint lets it lapse after ``lease_s``. Nothing (None) without a publisher or
    a demand."""
    if publish is None or demand is None:
        yield None
        return
    stated = StatedDemand(publish, demand)
    publish.demand(demand)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(demand.lease_s / 3):
            try:
                publish.demand(stated.demand)
            except Exception as exc:  # the endpoint may be restarting: try again next period
                log.warning("could not renew the trainer's demand at the endpoint: %s", exc)

    renewer = threading.Thread(target=renew, name="tinkertrace-demand-lease", daemon=True)
    renewer.start()
    try:
        yield stated
    finally:
        stop.set()
        renewer.join()
        publish.withdraw()
