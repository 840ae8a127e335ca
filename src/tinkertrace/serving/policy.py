"""The policy being served: a SamplingClient plus its tokenizer and version, swapped atomically.

A request takes one :class:`Policy` snapshot when it starts and samples with that snapshot's client;
requests that start after a swap use the new client. Requests being decoded when the swap happens
continue on the new weights from their next token where the client can take them over (the local
engine's ``SamplingClient.take_over``; ``inflight`` chooses whether their KV cache is kept or
recomputed, or turns this off), else they finish on the old weights. A client the holder cannot
take over (hosted Tinker's) is moved by the service instead: new weights then come as Tinker
``kind="inflight"`` sampling clients (:attr:`PolicyHolder.sampler_kind` decides which form). Each
sampled token's policy version comes back with it (:func:`policy_versions`). The holder works with
any object that has Tinker's ``SamplingClient.sample`` surface: the hosted Tinker client or the local
engine's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tinkertrace.serving.admission import AdmissionGate

InflightMode = Literal["keep-cache", "recompute-cache", "off"]
SamplerKind = Literal["snapshot", "inflight"]  # Tinker's ``types.SamplingClientKind``
INFLIGHT_HELP = (
    "How requests being decoded meet newly published weights: they continue on them from their next "
    "token, their KV cache kept ('keep-cache') or rebuilt under the new weights ('recompute-cache'), or "
    "finish on the weights they started with ('off'). On hosted Tinker new weights come as Tinker "
    "inflight sampling clients, whose cache is kept either way."
)

SamplerLoader = Callable[[str], Any]
"""Turns a ``tinker://.../sampler_weights/...`` path into a SamplingClient (e.g. a ServiceClient's
``create_sampling_client(model_path=...)``)."""


def resolve_client(client: Any) -> Any:
    """The SamplingClient itself when given a future of one (Tinker's ``create_sampling_client``
    returns a future that can be awaited or resolved with ``.result()``; it also answers the client's
    methods, deprecated, so it is told apart by its ``result``)."""
    return client.result() if callable(getattr(client, "result", None)) else client


class StalePolicyError(ValueError):
    """A swap asked for a version that is not newer than the one being served (and not the served
    weights in their other form)."""


@dataclass(frozen=True)
class Policy:
    """One immutable snapshot of what is being served."""

    sampling_client: Any
    version: int
    model_path: str | None = None
    loaded_at: float = field(default_factory=time.time)
    inflight: bool = False  # a Tinker inflight client: the service moves its running requests on


def _check_newer(current: Policy, version: int, model_path: str | None, inflight: bool) -> None:
    """StalePolicyError unless ``version`` is newer than ``current``'s or is ``current``'s weights in
    the other form (the same version and path: a snapshot for an inflight client, or back)."""
    same_weights = (version, model_path) == (current.version, current.model_path)
    if version <= current.version and not (same_weights and inflight != current.inflight):
        served = current.version
        raise StalePolicyError(f"policy version {version} is not newer than the served version {served}")


class PolicyHolder:
    """Holds the served :class:`Policy`; :meth:`swap` and :meth:`load` replace it atomically.

    ``tokenizer`` and ``model_name`` stay fixed for the holder's life: new weights are LoRA weights
    (or a fine-tune) of the same base model, so the chat template and vocabulary do not change.
    ``admission`` is the gate that decides which new rollouts may start sampling
    (:mod:`tinkertrace.serving.admission`); the trainer that publishes versions feeds it.
    """

    def __init__(
        self,
        sampling_client: Any,
        tokenizer: Any,
        model_name: str,
        *,
        version: int = 0,
        model_path: str | None = None,
        loader: SamplerLoader | None = None,
        inflight: InflightMode = "keep-cache",
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.aliases = tuple(a for a in dict.fromkeys(aliases) if a != model_name)
        self._loader = loader
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._policy = Policy(resolve_client(sampling_client), version, model_path)
        _label(self._policy.sampling_client, version)
        self.inflight = inflight
        self.swaps = 0
        self.taken_over = 0  # swaps that moved running requests onto the new weights
        self.admission = AdmissionGate()  # which new rollouts may start: set by the trainer's demand

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name a request may give for this model: ``model_name`` first, then its aliases."""
        return (self.model_name, *self.aliases)

    def current(self) -> Policy:
        """The snapshot to use for one whole request."""
        return self._policy  # a single reference read: atomic

    @property
    def version(self) -> int:
        return self._policy.version

    def swap(
        self,
        sampling_client: Any,
        version: int | None = None,
        model_path: str | None = None,
        *,
        inflight: bool = False,
    ) -> Policy:
        """Serve ``sampling_client`` from now on, as ``version`` (default: current + 1); ``inflight``:
        it is a Tinker inflight client (see :attr:`sampler_kind`).

        Raises :class:`StalePolicyError` when ``version`` is not newer than the served version, unless
        it is the served weights (same version and path) in the other form.
        """
        client = resolve_client(sampling_client)  # may block on a future: outside the lock
        with self._lock:
            current = self._policy
            new_version = current.version + 1 if version is None else int(version)
            _check_newer(current, new_version, model_path, inflight)
            self._policy = Policy(client, new_version, model_path, inflight=inflight)
            self.swaps += 1
            take_over = getattr(client, "take_over", None)
            if self.inflight != "off" and callable(take_over):
                recompute = self.inflight == "recompute-cache"
                self.taken_over += bool(take_over(current.sampling_client, new_version, recompute))
            else:
                _label(client, new_version)
            return self._policy

    def load(self, model_path: str, version: int | None = None, sampler_handle: str | None = None) -> Policy:
        """Create a SamplingClient for ``model_path`` with the holder's loader and swap to it; with
        ``sampler_handle`` (Tinker's handle of an inflight sampling client of the same weights) and
        :attr:`sampler_kind` ``"inflight"``, serve that client instead (``model_path`` stays the
        policy's path).

        Loading (which can take a while) happens outside the swap lock, so requests keep flowing on
        the old policy until the new one is ready. A version that is already served or older raises
        :class:`StalePolicyError` before anything is loaded (unless it is the served weights in the
        other form: a trainer that stops hands an inflight version back as its snapshot).
        """
        inflight = sampler_handle is not None and self.sampler_kind == "inflight"
        if self._loader is None and not inflight:
            raise RuntimeError("this PolicyHolder has no loader: pass loader= to load weights by path")
        with self._load_lock:  # one load at a time; swaps stay ordered
            if version is not None:
                _check_newer(self.current(), int(version), model_path, inflight)
            if sampler_handle is not None and inflight:
                client = open_sampler_handle(sampler_handle)
            else:
                assert self._loader is not None
                client = self._loader(model_path)
            return self.swap(client, version, model_path, inflight=inflight)

    @property
    def sampler_kind(self) -> SamplerKind:
        """The form new weights should reach this endpoint in — the one place that decides it.

        ``"inflight"`` when requests being decoded are to continue on new weights (``inflight`` is
        not off) and the served client is not one :meth:`swap` can take over (hosted Tinker's
        ``SamplingClient``): the service must move them, so the publisher sends a Tinker
        ``kind="inflight"`` sampling client, which shares one mutable weights target with the
        clients before it. ``"snapshot"`` otherwise: a sampler path to :meth:`load` (the local
        engine's client takes running requests over itself, cache kept or recomputed), or in-flight
        updates are off and running requests finish on the weights they started on."""
        taken_over_here = callable(getattr(self._policy.sampling_client, "take_over", None))
        return "snapshot" if self.inflight == "off" or taken_over_here else "inflight"

    def close(self) -> None:
        """Stop the served client's threads when it has any (the local engine's sampler: requests it is
        still decoding fail); call once nothing is served any more. Clients swapped out earlier stop
        their decoding thread on their own once idle."""
        close = getattr(self._policy.sampling_client, "close", None)
        if callable(close):
            close(cancel=True)


def _label(client: Any, version: int) -> None:
    """Name ``version`` on the tokens ``client`` samples, where it records versions per token."""
    if hasattr(client, "policy_version"):
        client.policy_version = version


def open_sampler_handle(handle: str) -> Any:
    """The Tinker ``SamplingClient`` behind ``handle`` (``SamplingClient.get_sampler_handle()`` in the
    process that made it, e.g. the trainer's inflight client), with this process's Tinker key."""
    import tinker

    return tinker.SamplingClient.from_sampler_handle(handle)


def policy_versions(sequence: Any, policy: Policy) -> list[int]:
    """The policy version of each token of a ``sequence`` sampled with ``policy``: recorded by the
    sampler where the holder labels its versions (the local engine's client), else the policy's version
    for all (a client the holder cannot label, e.g. one wrapping the engine's, records its own). For a
    hosted Tinker inflight client that is a lower bound: its later tokens may come from newer weights,
    and Tinker's responses do not say which."""
    recorded = getattr(sequence, "policy_versions", None)
    if recorded is not None and hasattr(policy.sampling_client, "policy_version"):
        return [int(v) for v in recorded]
    return [policy.version] * len(sequence.tokens)


def model_tokenizer(model: str, sampling_client: Any) -> Any:
    """``model``'s tokenizer: built in, or a local model's own; for a name only the service knows
    (a hosted Tinker model), the sampling client's."""
    from tinkertrace.models.tokenizer import TokenizerNotFoundError, load_tokenizer

    try:
        return load_tokenizer(model)
    except TokenizerNotFoundError:
        if not hasattr(sampling_client, "get_tokenizer"):
            raise
        return sampling_client.get_tokenizer()


def policy_from_service(
    service: Any,
    model: str,
    *,
    model_path: str | None = None,
    served_name: str | list[str] | None = None,
    version: int = 0,
    inflight: InflightMode = "keep-cache",
) -> PolicyHolder:
    """The one way to serve a model: a :class:`PolicyHolder` over ``service`` (the local engine's or
    hosted Tinker's ``ServiceClient``) sampling ``model``, or the sampler weights at ``model_path``,
    whose loader opens further ``tinker://`` sampler paths for weight swaps. ``served_name``: the name
    (or names: the first answered, the others aliases) requests give for the model."""
    names = [served_name] if isinstance(served_name, str) else list(served_name or [])
    if model_path:
        sampling_client = resolve_client(service.create_sampling_client(model_path=model_path))
    else:
        sampling_client = resolve_client(service.create_sampling_client(base_model=model))
    return PolicyHolder(
        sampling_client,
        model_tokenizer(model, sampling_client),
        names[0] if names else model,
        version=version,
        model_path=model_path,
        loader=lambda path: service.create_sampling_client(model_path=path),
        inflight=inflight,
        aliases=tuple(names[1:]),
    )
