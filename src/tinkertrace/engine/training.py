"""The local TrainingClient: Tinker's training calls on a torch model, in order, on one worker thread."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture
from transformers import PreTrainedTokenizerBase

from tinkertrace.engine.batching import MICROBATCH_TOKENS, PASS_TOKENS, collate, microbatches
from tinkertrace.engine.futures import ClientFuture, OrderedWorker
from tinkertrace.engine.losses import LossSpec, get_loss
from tinkertrace.engine.model import (
    TRAINABLE_FILE,
    ModelSpec,
    build_trainable,
    inference_copy,
    load_trainable_state,
    save_trainable_state,
)
from tinkertrace.engine.sampling import SamplingClient, load_sampling_client
from tinkertrace.engine.storage import (
    EXTERNAL_WEIGHTS,
    SAMPLER_WEIGHTS,
    WEIGHTS,
    CheckpointStore,
    Kind,
    age_encrypter,
    new_run_id,
)
from tinkertrace.models.catalog import quiet_progress
from tinkertrace.models.tokenizer import load_tokenizer

OPTIMIZER_FILE = "optimizer.pt"
LossConfig = Mapping[str, float | str] | None


class TrainingClient:
    """Trains one model; same methods and return types as `tinker.TrainingClient`.

    Every call is queued on this client's worker thread and returns a future at once, so
    ``forward_backward`` and ``optim_step`` can be submitted back to back. Gradients from
    several ``forward_backward`` calls add up until the next ``optim_step``.

    The run is recorded in the store (``run.json``: spec, ``model_name`` — the name the run was
    asked for, which may be an alias of ``spec.base_model`` — and ``user_metadata``).
    """

    def __init__(
        self,
        spec: ModelSpec,
        store: CheckpointStore,
        device: torch.device,
        run_id: str | None = None,
        *,
        user_metadata: Mapping[str, Any] | None = None,
        model_name: str | None = None,
    ) -> None:
        self.spec = spec
        self.model_id = run_id or new_run_id()
        self.model_name = model_name or spec.base_model
        self.user_metadata = {str(k): str(v) for k, v in (user_metadata or {}).items()}
        self._store = store
        self._device = device
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self._model: Any = build_trainable(spec, device)  # a transformers (or peft) model
        self._tokenizer = load_tokenizer(spec.base_model)
        self._model.train()
        self._params = [p for p in self._model.parameters() if p.requires_grad]
        self._optimizer: torch.optim.AdamW | None = None
        self._step = 0
        self._inflight: SamplingClient | None = None  # the latest kind="inflight" client (shared batcher)
        self.microbatch_tokens = MICROBATCH_TOKENS
        self.pass_tokens = PASS_TOKENS.get(self._device.type, PASS_TOKENS["cuda"])
        self._worker = OrderedWorker(f"tinkertrace-train-{self.model_id}")
        store.write_run(
            self.model_id,
            {
                "run_id": self.model_id,
                "model_name": self.model_name,
                "spec": spec.to_dict(),
                "user_metadata": self.user_metadata,
                "created": time.time(),
            },
        )

    # -- forward / backward ------------------------------------------------------------------

    def forward(
        self, data: list[types.Datum], loss_fn: types.LossFnType, loss_fn_config: LossConfig = None
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss and per-token logprobs without gradients."""
        return self._submit_run(data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: list[types.Datum], loss_fn: types.LossFnType, loss_fn_config: LossConfig = None
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss, per-token logprobs, and gradients (accumulated until `optim_step`)."""
        return self._submit_run(data, loss_fn, loss_fn_config, backward=True)

    def _submit_run(
        self, data: list[types.Datum], loss_fn: types.LossFnType, loss_fn_config: LossConfig, backward: bool
    ) -> APIFuture[types.ForwardBackwardOutput]:
        spec, config = get_loss(loss_fn, loss_fn_config)
        return self._worker.submit(self._run, list(data), loss_fn, spec, config, backward)

    def _run(
        self,
        data: list[types.Datum],
        loss_name: str,
        spec: LossSpec,
        config: dict[str, float],
        backward: bool,
    ) -> types.ForwardBackwardOutput:
        vocab = int(self._model.get_output_embeddings().weight.shape[0])
        batch = collate(data, spec, loss_name, vocab, self._device)
        logprobs: list[np.ndarray] = [np.zeros(0)] * len(data)  # per Datum, in the Datums' order
        losses: list[np.ndarray] = [np.zeros(0)] * len(data)
        total = 0.0
        for rows in microbatches(batch.lengths, self.microbatch_tokens, self.pass_tokens):
            width = batch.lengths[rows[-1]]  # this pass's own longest row (rows go shortest first)
            index = torch.from_numpy(rows).to(self._device)
            with torch.set_grad_enabled(backward):
                logits = self._model(input_ids=batch.input_ids[index, :width]).logits.float()
                targets = batch.inputs["target_tokens"][index, :width]
                target_lp = -torch.nn.functional.cross_entropy(
                    logits.transpose(1, 2), targets, reduction="none"
                )
                inputs = {k: v[index, :width] for k, v in batch.inputs.items() if k != "target_tokens"}
                elementwise = spec.fn(target_lp, inputs, config) * batch.valid[index, :width]
                loss = elementwise.sum()
                if backward:
                    loss.backward()
            total += float(loss.detach())
            for r, lp, el in zip(
                rows.tolist(),
                target_lp.detach().cpu().numpy(),
                elementwise.detach().cpu().numpy(),
                strict=True,
            ):
                logprobs[r], losses[r] = lp[: batch.lengths[r]], el[: batch.lengths[r]]
        outputs = [
            {
                "logprobs": types.TensorData.from_numpy(lp.copy()),
                "elementwise_loss": types.TensorData.from_numpy(el.copy()),
            }
            for lp, el in zip(logprobs, losses, strict=True)
        ]
        return types.ForwardBackwardOutput(
            loss_fn_output_type="TorchLossReturn", loss_fn_outputs=outputs, metrics={"loss:sum": total}
        )

    # -- optimizer ---------------------------------------------------------------------------

    def optim_step(
        self, optim_params: types.AdamParams | None = None, *, adam_params: types.AdamParams | None = None
    ) -> APIFuture[types.OptimStepResponse]:
        """One AdamW step (torch.optim.AdamW) with the given hyper-parameters; then gradients reset."""
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError(f"the local engine takes tinker.types.AdamParams, got {type(params).__name__}")
        return self._worker.submit(self._optim_step, params)

    def _ensure_optimizer(self) -> torch.optim.AdamW:
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(
                self._params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
            )
        return self._optimizer

    def _optim_step(self, params: types.AdamParams) -> types.OptimStepResponse:
        optimizer = self._ensure_optimizer()
        for group in optimizer.param_groups:
            group.update(
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        max_norm = params.grad_clip_norm if params.grad_clip_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, max_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._step += 1
        return types.OptimStepResponse(
            metrics={"grad_norm": grad_norm, "learning_rate": params.learning_rate, "step": float(self._step)}
        )

    # -- checkpoints -------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return {
            "run_id": self.model_id,
            "step": self._step,
            "spec": self.spec.to_dict(),
            "base_model": self.spec.base_model,
            "model_name": self.model_name,
        }

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[types.SaveWeightsResponse]:
        """Save trainable weights and optimizer state as ``tinker://<run>/weights/<name>``."""

        def run() -> types.SaveWeightsResponse:
            def fill(folder: Path) -> None:
                save_trainable_state(self._model, folder)
                if self._optimizer is not None:
                    torch.save(self._optimizer.state_dict(), folder / OPTIMIZER_FILE)

            meta = {**self._meta(), "kind": WEIGHTS, "user_metadata": user_metadata or {}}
            path = self._store.write(
                self.model_id, WEIGHTS, name, meta, fill, overwrite=overwrite, ttl_seconds=ttl_seconds
            )
            return types.SaveWeightsResponse(path=path)

        return self._worker.submit(run)

    def load_state(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        """Load trainable weights from a saved state (optimizer state is reset)."""
        return self._worker.submit(self._load_state, path, False)

    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        """Load trainable weights and the optimizer state from a saved state."""
        return self._worker.submit(self._load_state, path, True)

    def _load_state(self, path: str, with_optimizer: bool) -> types.LoadWeightsResponse:
        folder, meta = self._store.resolve(path, expected_kind=WEIGHTS)
        saved = ModelSpec(**meta["spec"])
        if (saved.base_model, saved.lora_rank) != (self.spec.base_model, self.spec.lora_rank):
            raise ValueError(
                f"{path!r} holds {saved.base_model!r} rank {saved.lora_rank}; this client trains "
                f"{self.spec.base_model!r} rank {self.spec.lora_rank}"
            )
        load_trainable_state(self._model, load_file(str(folder / TRAINABLE_FILE), device=str(self._device)))
        self._optimizer = None
        if with_optimizer:
            opt_file = folder / OPTIMIZER_FILE
            if opt_file.is_file():  # absent when saved before the first step: a fresh optimizer is exact
                state = torch.load(opt_file, map_location=self._device, weights_only=True)
                self._ensure_optimizer().load_state_dict(state)
            self._step = int(meta.get("step", 0))
        return types.LoadWeightsResponse(path=path, model_id=self.model_id)

    def _snapshot_client(self, model_path: str | None) -> SamplingClient:
        return SamplingClient(inference_copy(self._model), self._tokenizer, self.spec.base_model, model_path)

    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None, user_metadata: dict[str, str] | None = None
    ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Save weights to sample from as ``tinker://<run>/sampler_weights/<name>``: a LoRA run's LoRA
        weights alone (merged into the base model when loaded, as Tinker keeps LoRA sampler weights),
        a full fine-tuning run's merged Hugging Face folder with the tokenizer."""

        def run() -> types.SaveWeightsForSamplerResponse:
            if not self.spec.is_lora:
                return types.SaveWeightsForSamplerResponse(
                    path=self._save_hf_folder(SAMPLER_WEIGHTS, name, ttl_seconds, user_metadata)
                )
            meta = {**self._meta(), "kind": SAMPLER_WEIGHTS, "user_metadata": user_metadata or {}}
            path = self._store.write(
                self.model_id,
                SAMPLER_WEIGHTS,
                name,
                meta,
                lambda folder: save_trainable_state(self._model, folder),
                overwrite=True,
                ttl_seconds=ttl_seconds,
            )
            return types.SaveWeightsForSamplerResponse(path=path)

        return self._worker.submit(run)

    def save_weights_external(
        self, name: str, ttl_seconds: int | None = None, age_encryption_recipients: list[str] | None = None
    ) -> APIFuture[types.SaveWeightsExternalResponse]:
        """Export the weights for download: ``tinker://<run>/external_weights/<name>``, the same Hugging
        Face folder as ``save_weights_for_sampler`` (LoRA merged in, tokenizer included). With
        ``age_encryption_recipients`` every file is age-encrypted to them and named ``<file>.age``."""
        recipients = list(age_encryption_recipients or [])
        encrypt = age_encrypter(recipients) if recipients else None  # bad recipients fail here, at once

        def run() -> types.SaveWeightsExternalResponse:
            path = self._save_hf_folder(EXTERNAL_WEIGHTS, name, ttl_seconds, None, encrypt)
            return types.SaveWeightsExternalResponse(path=path)

        return self._worker.submit(run)

    def _save_hf_folder(
        self,
        kind: Kind,
        name: str,
        ttl_seconds: int | None,
        user_metadata: dict[str, str] | None,
        encrypt: Callable[[Path], None] | None = None,
    ) -> str:
        """Write the merged model + tokenizer as a Hugging Face folder checkpoint of ``kind``; its path."""

        def fill(folder: Path) -> None:
            with quiet_progress():
                inference_copy(self._model).save_pretrained(str(folder))
            self._tokenizer.save_pretrained(str(folder))
            if encrypt is not None:
                for file in [f for f in folder.rglob("*") if f.is_file()]:
                    encrypt(file)

        meta = {**self._meta(), "kind": kind, "user_metadata": user_metadata or {}}
        return self._store.write(
            self.model_id, kind, name, meta, fill, overwrite=True, ttl_seconds=ttl_seconds
        )

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: object | None = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> ClientFuture[SamplingClient]:
        """A SamplingClient on the current weights (kept in memory; ``name`` is ignored).

        ``kind="snapshot"``: fixed weights. ``kind="inflight"`` (Tinker's contract,
        ``tinker.types.SamplingClientKind``): every inflight client of this run samples from one shared
        batcher whose weights each inflight save updates, sequences being decoded included (from their
        next token, their KV cache kept); unlike hosted Tinker, each token records the version that
        sampled it: this run's optimizer step count at the save."""
        if kind == "inflight":
            return ClientFuture(self._worker.submit(self._inflight_client))
        if kind != "snapshot":
            raise ValueError(f"sampling client kind {kind!r} is not supported (use 'snapshot' or 'inflight')")
        return ClientFuture(self._worker.submit(self._snapshot_client, None))

    def _inflight_client(self) -> SamplingClient:
        client = self._snapshot_client(None)
        client.policy_version = self._step
        if self._inflight is not None:
            client.take_over(self._inflight, self._step)
        self._inflight = client
        return client

    def create_sampling_client(
        self, model_path: str, retry_config: object | None = None, record_stability_info: bool = False
    ) -> ClientFuture[SamplingClient]:
        """A SamplingClient for saved sampler weights (queued after this client's pending saves)."""
        return ClientFuture(self._worker.submit(load_sampling_client, self._store, model_path, self._device))

    # -- info --------------------------------------------------------------------------------

    def get_info(self) -> types.GetInfoResponse:
        base = self._model.get_base_model() if self.spec.is_lora else self._model
        return types.GetInfoResponse(
            model_data=types.ModelData(
                arch=str(base.config.model_type),
                model_name=self.model_name,
                tokenizer_id=self.spec.base_model,
            ),
            model_id=self.model_id,
            is_lora=self.spec.is_lora,
            lora_rank=self.spec.lora_rank if self.spec.is_lora else None,
            model_name=self.model_name,
        )

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def step(self) -> int:
        """Number of optimizer steps taken (restored by `load_state_with_optimizer`)."""
        return self._step

    def close(self) -> None:
        """Finish queued calls and stop the worker thread."""
        self._worker.shutdown(wait=True)
