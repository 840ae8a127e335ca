"""Models for the local engine: the built-in tiny decoder, local Hugging Face folders, LoRA.

The built-in model (`tinkertrace/tiny-chat`, optionally with a size suffix such as
`tinkertrace/tiny-chat:base`) is a small Llama-architecture decoder over the built-in byte-level
tokenizer, randomly initialised from a fixed seed, so every process builds the same base weights
without downloading anything. Any other name is resolved by :func:`tinkertrace.models.model_folder`:
a packaged model (``smollm2-135m-instruct``), a GGUF file (dequantised once into a cached folder) or
a local Hugging Face model folder.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from tinkertrace.models.catalog import ModelNotFoundError, model_folder, quiet_progress
from tinkertrace.models.tokenizer import BUILTIN_MODEL, BUILTIN_VOCAB_SIZE

BASE_INIT_SEED = 1234
"""Seed of the built-in base weights (fixed: the 'pretrained' weights of the built-in model)."""

LORA_ALPHA = 32
"""LoRA alpha used for every rank (scaling = alpha / rank)."""

TRAINABLE_FILE = "trainable.safetensors"
"""The trainable weights' file, in a training state and in a LoRA run's sampler checkpoint."""

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)


@dataclass(frozen=True)
class BuiltinSize:
    """Shape of one built-in model size."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048


BUILTIN_SIZES: dict[str, BuiltinSize] = {
    "nano": BuiltinSize(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=192),
    "small": BuiltinSize(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=384),
    "base": BuiltinSize(hidden_size=192, num_layers=4, num_heads=6, intermediate_size=512),
}
"""Built-in sizes: about 0.1M, 0.5M and 1.9M parameters."""

DEFAULT_BUILTIN_SIZE = "small"


def builtin_size(base_model: str) -> str | None:
    """The size name if ``base_model`` names the built-in model (``name`` or ``name:size``), else None."""
    if base_model == BUILTIN_MODEL:
        return DEFAULT_BUILTIN_SIZE
    prefix = BUILTIN_MODEL + ":"
    if base_model.startswith(prefix):
        size = base_model[len(prefix) :]
        if size not in BUILTIN_SIZES:
            raise ModelNotFoundError(
                f"unknown built-in size {size!r} in {base_model!r}; choose one of {sorted(BUILTIN_SIZES)}"
            )
        return size
    return None


def builtin_config(size: str) -> LlamaConfig:
    """The transformers config of a built-in size."""
    s = BUILTIN_SIZES[size]
    return LlamaConfig(
        vocab_size=BUILTIN_VOCAB_SIZE,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_heads,
        max_position_embeddings=s.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=258,
        pad_token_id=259,
    )


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when available, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPE_ENV = "TINKERTRACE_DTYPE"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def frozen_dtype(device: torch.device) -> torch.dtype:
    """The dtype of weights that are not trained (a LoRA run's base, samplers): ``$TINKERTRACE_DTYPE``
    (float32 or bfloat16) when set, else bfloat16 on a CUDA device that supports it, else float32."""
    import os

    chosen = os.environ.get(DTYPE_ENV, "").strip().lower() or "auto"
    if chosen == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    if chosen not in DTYPES:
        raise ValueError(f"{DTYPE_ENV}={chosen!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[chosen]


def load_base_model(
    base_model: str, device: torch.device, dtype: torch.dtype | None = None
) -> PreTrainedModel:
    """Build the built-in model (seeded) or load a named, GGUF or folder model, in ``dtype`` (default:
    :func:`frozen_dtype`); never downloads."""
    dtype = dtype or frozen_dtype(device)
    size = builtin_size(base_model)
    if size is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(BASE_INIT_SEED)
            model = LlamaForCausalLM(builtin_config(size))
        model.config.name_or_path = base_model
        return model.to(device=device, dtype=dtype)
    path = model_folder(base_model)
    try:
        with quiet_progress():
            model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"no loadable causal LM in {str(path)!r}: {exc}") from exc
    return untie_embeddings(model).to(device)


def untie_embeddings(model: PreTrainedModel) -> PreTrainedModel:
    """Give a model whose output layer shares the input embedding (SmolLM2) its own copy of it.

    LoRA on the unembedding of a tied model would, once merged for sampling, also change the input
    embeddings, so the sampler would no longer be the trained policy; untied, merging is exact."""
    output = model.get_output_embeddings()
    inputs = model.get_input_embeddings()
    if output is not None and output.weight is inputs.weight:
        output.weight = torch.nn.Parameter(inputs.weight.detach().clone())
        model.config.tie_word_embeddings = False
        if hasattr(model.config, "get_text_config"):
            model.config.get_text_config().tie_word_embeddings = False
    return model


def lora_target_modules(
    model: torch.nn.Module, train_mlp: bool, train_attn: bool, train_unembed: bool
) -> list[str]:
    """Names of the Linear modules LoRA should adapt, by the SDK's train_* flags."""
    wanted = (
        (ATTN_MODULES if train_attn else ())
        + (MLP_MODULES if train_mlp else ())
        + (UNEMBED_MODULES if train_unembed else ())
    )
    present = {
        name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)
    }
    targets = [m for m in wanted if m in present]
    if not targets:
        raise ValueError(
            "LoRA needs at least one of train_mlp, train_attn, train_unembed with matching layers"
        )
    return targets


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a trainable model; saved with every checkpoint."""

    base_model: str
    lora_rank: int
    seed: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    @property
    def is_lora(self) -> bool:
        return self.lora_rank > 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def build_trainable(spec: ModelSpec, device: torch.device) -> torch.nn.Module:
    """The base model with LoRA adapters of ``spec.lora_rank`` (seeded), or the full model when rank is 0.

    Trained weights are float32 (peft keeps a bfloat16 base's adapters in float32); only a LoRA run's
    frozen base takes :func:`frozen_dtype`."""
    if not spec.is_lora:
        model = load_base_model(spec.base_model, device, torch.float32)
        model.requires_grad_(True)
        return model
    model = load_base_model(spec.base_model, device)
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.lora_rank,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=lora_target_modules(model, spec.train_mlp, spec.train_attn, spec.train_unembed),
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        return get_peft_model(model, config)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters (LoRA adapters, or all weights for full fine-tuning), detached copies."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable parameters into ``model``; names must match exactly."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name].to(param.device, param.dtype))


def save_trainable_state(model: torch.nn.Module, folder: Path) -> None:
    """Write ``model``'s trainable parameters to ``folder/TRAINABLE_FILE``."""
    save_file({k: v.contiguous().cpu() for k, v in trainable_state(model).items()}, folder / TRAINABLE_FILE)


def merged_from_state(spec: ModelSpec, folder: Path, device: torch.device) -> PreTrainedModel:
    """The frozen base model of ``spec`` with the LoRA weights saved in ``folder`` merged in."""
    model = build_trainable(spec, device)
    load_trainable_state(model, load_file(str(folder / TRAINABLE_FILE), device=str(device)))
    return freeze(model.merge_and_unload())  # type: ignore[operator]


def freeze(model: PreTrainedModel) -> PreTrainedModel:
    """Put ``model`` in eval mode without gradients (for sampling)."""
    model.eval()
    model.requires_grad_(False)
    return model


def inference_copy(model: torch.nn.Module) -> PreTrainedModel:
    """A frozen, eval-mode copy of ``model`` with any LoRA merged in (the sampler's snapshot)."""
    from peft import PeftModel

    snapshot = copy.deepcopy(model)
    if isinstance(snapshot, PeftModel):
        snapshot = snapshot.merge_and_unload()
    return freeze(snapshot)


def parameter_count(model: torch.nn.Module) -> int:
    """Total number of parameters."""
    return sum(p.numel() for p in model.parameters())
