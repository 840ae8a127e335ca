"""``num_substeps``: a training step as several optimiser steps on contiguous minibatches (the
cookbook's form), on the real local engine — the same updates as doing it by hand, and PPO's clip
acting from the second minibatch on."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.settings import ConfigError
from tinkertrace.training.config import TrainSettings, make_config
from tinkertrace.training.datums import DatumBatch, build_datums
from tinkertrace.training.step import adam_params, merged_loss_metrics, minibatches, train_step

MODEL = f"{BUILTIN_MODEL}:nano"
TEXTS = [("Who are you? ", "I am a tiny chat model."), ("Name? ", "tinkertrace, at your service")]


def test_minibatches_are_contiguous_near_equal_and_never_empty() -> None:
    assert minibatches(8, 1) == [slice(0, 8)]
    assert [s.stop - s.start for s in minibatches(10, 4)] == [2, 3, 2, 3]
    assert minibatches(3, 4) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # fewer Datums than substeps
    parts = minibatches(7, 3)
    assert parts[0].start == 0 and parts[-1].stop == 7
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))


def test_minibatch_loss_metrics_merge_by_their_reduction() -> None:
    first = {"loss:sum": 1.5, "ratio:max": 2.0, "kl:mean": 0.1}
    second = {"loss:sum": 2.5, "ratio:max": 3.0, "kl:mean": 0.3}
    merged = merged_loss_metrics([first, second])
    assert merged == pytest.approx({"loss:sum": 4.0, "ratio:max": 3.0, "kl:mean": 0.2})


def test_num_substeps_below_one_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_substeps must be at least 1"):
        make_config(overrides={"source": tmp_path, "num_substeps": 0}).validate()


def _client(tmp_path: Path, name: str) -> object:
    service = ServiceClient(tmp_path / name, device="cpu", cpu_threads=1)
    return service.create_lora_training_client(MODEL, rank=4, seed=0).result()


def _sequences() -> tuple[pa.Array, pa.Array]:
    tok = load_tokenizer(BUILTIN_MODEL)
    seqs = [tok.encode(p + r, add_special_tokens=False) for p, r in TEXTS]
    prompt = [len(tok.encode(p, add_special_tokens=False)) for p, _ in TEXTS]
    masks = [[0] * n + [1] * (len(s) - n) for s, n in zip(seqs, prompt, strict=True)]
    return pa.array(seqs), pa.array(masks)


def _logprobs(client: object, seqs: pa.Array, masks: pa.Array) -> list[np.ndarray]:
    """Each token's logprob under the client's current weights (0 first: it has no prediction)."""
    zeros = pa.array([[0.0] * len(s) for s in seqs.to_pylist()])
    data = build_datums(seqs, zeros, masks, np.zeros(len(seqs)), loss_fn="cross_entropy").data
    out = client.forward(data, "cross_entropy").result()  # type: ignore[attr-defined]
    return [np.r_[0.0, o["logprobs"].to_numpy()] for o in out.loss_fn_outputs]


def _batch(seqs: pa.Array, masks: pa.Array, logprobs: list[np.ndarray], repeat: int) -> DatumBatch:
    """The two sequences ``repeat`` times over (advantages +1, −1), the Datums' logprobs ``logprobs``."""
    return build_datums(
        pa.array(seqs.to_pylist() * repeat), pa.array([lp.tolist() for lp in logprobs] * repeat),
        pa.array(masks.to_pylist() * repeat), np.array([1.0, -1.0] * repeat), loss_fn="ppo",
    )  # fmt: skip


def test_substeps_are_the_optimiser_steps_of_each_minibatch_in_turn(tmp_path: Path) -> None:
    """Two substeps on four Datums give exactly the weights of forward_backward + optim_step on the
    first two, then on the last two; one substep on the same batch does not."""
    seqs, masks = _sequences()
    clients = {name: _client(tmp_path, name) for name in ("split", "by_hand", "whole")}
    start = _logprobs(clients["split"], seqs, masks)
    config = TrainSettings(source=tmp_path, log_dir=tmp_path, loss="ppo", learning_rate=3e-2, num_substeps=2)
    adam = adam_params(config)

    metrics = train_step(clients["split"], _batch(seqs, masks, start, 2), config, adam)
    one_config = TrainSettings(source=tmp_path, log_dir=tmp_path, loss="ppo", learning_rate=3e-2)
    for _ in range(2):  # by hand: one optimiser step per half
        train_step(clients["by_hand"], _batch(seqs, masks, start, 1), one_config, adam)
    train_step(clients["whole"], _batch(seqs, masks, start, 2), one_config, adam)

    split, by_hand, whole = (_logprobs(clients[n], seqs, masks) for n in ("split", "by_hand", "whole"))
    for a, b in zip(split, by_hand, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert max(np.abs(a - c).max() for a, c in zip(split, whole, strict=True)) > 1e-3
    assert metrics["optim/substeps"] == 2


def test_the_clip_acts_from_the_second_substep_on(tmp_path: Path) -> None:
    """With the Datums' logprobs the trainer's own (an on-policy batch, or correct mode's proximal
    policy), one optimiser step per batch clips nothing (every ratio is 1 where the gradient is
    taken); with two, the second minibatch sees the first one's update and its tokens pushed past
    0.8/1.2 are clipped. The mismatch KL still measures the step's start: ~0 on-policy either way."""
    seqs, masks = _sequences()
    for substeps, clipped in ((1, False), (2, True)):
        client = _client(tmp_path, f"clip{substeps}")
        proximal = _logprobs(client, seqs, masks)
        config = TrainSettings(
            source=tmp_path, log_dir=tmp_path, loss="ppo", learning_rate=3e-2, num_substeps=substeps
        )
        metrics = train_step(client, _batch(seqs, masks, proximal, 2), config, adam_params(config))
        assert (metrics["offpolicy/clipped_frac"] > 0) is clipped, (substeps, metrics)
        assert metrics["offpolicy/mismatch_kl"] < 1e-9, (substeps, metrics)
