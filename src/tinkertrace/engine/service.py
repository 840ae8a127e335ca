"""The local ServiceClient: creates training and sampling clients, like `tinker.ServiceClient`."""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture

from tinkertrace.engine.futures import ClientFuture, completed
from tinkertrace.engine.model import (
    BUILTIN_SIZES,
    DEFAULT_BUILTIN_SIZE,
    ModelSpec,
    freeze,
    load_base_model,
    pick_device,
)
from tinkertrace.engine.sampling import SamplingClient, load_sampling_client
from tinkertrace.engine.storage import WEIGHTS, CheckpointStore
from tinkertrace.engine.training import TrainingClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer


class ServiceClient:
    """Entry point of the local engine, with the `tinker.ServiceClient` methods the loop and server use.

    ``base_dir`` holds checkpoints (default ``$TINKERTRACE_HOME/engine``); ``device`` defaults to
    CUDA when available, else CPU. ``cpu_threads`` (default: ``$TINKERTRACE_CPU_THREADS`` when
    set) sets torch's process-wide intra-op thread count: 1 is fastest for the built-in models on
    a small, busy CPU. Other keyword arguments of
    the SDK's constructor are accepted and ignored, so this class can stand in for
    `tinker.ServiceClient`.
    """

    def __init__(
        self,
        base_dir: str | Path | None = None,
        *,
        device: str | None = None,
        cpu_threads: int | None = None,
        **sdk_kwargs: Any,
    ) -> None:
        self.store = CheckpointStore(base_dir)
        self._samplers: weakref.WeakSet[SamplingClient] = weakref.WeakSet()  # closed by close()
        self.device = pick_device(device)
        if cpu_threads is None and os.environ.get("TINKERTRACE_CPU_THREADS"):
            cpu_threads = int(os.environ["TINKERTRACE_CPU_THREADS"])
        if cpu_threads is not None:
            if cpu_threads < 1:
                raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads}")
            torch.set_num_threads(cpu_threads)

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        run_id: str | None = None,
        model_name: str | None = None,
    ) -> ClientFuture[TrainingClient]:
        """A TrainingClient with LoRA adapters of ``rank`` (seeded); ``rank=0`` trains all weights.

        ``user_metadata`` is recorded with the run (``run.json``). Extensions, used by ``tinkertrace
        engine``: ``run_id`` names the run instead of a fresh id; ``model_name`` is the name the run
        answers to when ``base_model`` was reached through an alias.
        """
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be a non-negative integer (0 = full fine-tuning), got {rank!r}")
        _check_optimizer(optimizer)
        spec = ModelSpec(
            base_model=base_model,
            lora_rank=rank,
            seed=int.from_bytes(os.urandom(4), "little") if seed is None else int(seed),
            train_mlp=train_mlp,
            train_attn=train_attn,
            train_unembed=train_unembed,
        )
        client = TrainingClient(
            spec, self.store, self.device, run_id=run_id, user_metadata=user_metadata, model_name=model_name
        )
        return ClientFuture(client)

    def _from_state(
        self,
        path: str,
        base_model: str | None,
        with_optimizer: bool,
        run_id: str | None,
        user_metadata: dict[str, str] | None,
    ) -> ClientFuture[TrainingClient]:
        """A new run from a training state; it keeps the source run's model name and ``user_metadata``
        (updated with ``user_metadata``)."""
        _, meta = self.store.resolve(path, expected_kind=WEIGHTS)
        spec = ModelSpec(**meta["spec"])
        if base_model is not None and base_model != spec.base_model:
            raise ValueError(f"{path!r} was trained from {spec.base_model!r}, not {base_model!r}")
        source = self.store.read_run(str(meta.get("run_id", ""))) or {}
        client = TrainingClient(
            spec,
            self.store,
            self.device,
            run_id=run_id,
            user_metadata={**(source.get("user_metadata") or {}), **(user_metadata or {})},
            model_name=source.get("model_name"),
        )
        future = client.load_state_with_optimizer(path) if with_optimizer else client.load_state(path)
        future.result()
        return ClientFuture(client)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        run_id: str | None = None,
    ) -> ClientFuture[TrainingClient]:
        """A new training run starting from saved weights (fresh optimizer state)."""
        _check_optimizer(optimizer)
        return self._from_state(path, base_model, False, run_id, user_metadata)

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        *,
        run_id: str | None = None,
    ) -> ClientFuture[TrainingClient]:
        """A new training run resuming saved weights and optimizer state exactly."""
        return self._from_state(path, base_model, True, run_id, user_metadata)

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: object | None = None,
        record_stability_info: bool = False,
    ) -> ClientFuture[SamplingClient]:
        """A SamplingClient for saved sampler weights (``model_path``) or an untrained base model."""
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")
        if model_path is not None:
            sampler = load_sampling_client(self.store, model_path, self.device)
        else:
            assert base_model is not None
            model = freeze(load_base_model(base_model, self.device))
            sampler = SamplingClient(model, load_tokenizer(base_model), base_model)
        self._samplers.add(sampler)
        return ClientFuture(sampler)

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The built-in model sizes (any local Hugging Face folder works too)."""
        sizes = {BUILTIN_MODEL: DEFAULT_BUILTIN_SIZE} | {f"{BUILTIN_MODEL}:{s}": s for s in BUILTIN_SIZES}
        return types.GetServerCapabilitiesResponse(
            supported_models=[
                types.SupportedModel(
                    model_name=name,
                    max_context_length=BUILTIN_SIZES[size].max_position_embeddings,
                    trainable=True,
                    sampleable=True,
                )
                for name, size in sizes.items()
            ]
        )

    def close(self, status: str = "success", detail: str | None = None) -> APIFuture[None]:
        """Stop the sampling clients this service made (failing requests still decoding), like
        ``tinker.ServiceClient.close(status)`` ends a session; a done future. Training clients finish
        their queued calls on their own (non-daemon) threads."""
        for sampler in list(self._samplers):
            sampler.close(cancel=True)
        return completed(None)

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close("success" if exc[0] is None else "errored")


def _check_optimizer(optimizer: types.OptimizerConfig | None) -> None:
    if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
        raise ValueError(f"the local engine supports the AdamW optimizer only, got {optimizer!r}")
