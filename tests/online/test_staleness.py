"""Per-token policy versions (one helper, with or without the builder's per-token column), row ages,
the staleness bound by rollout or by whole group, the staleness histograms, and the mismatch KL by token
age on the real engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.online.staleness import (
    VERSIONS_COLUMN,
    correct_batch,
    rollout_ages,
    row_ages,
    stale_rows,
    staleness_metrics,
    target_ages,
    token_policy_versions,
)
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.datums import build_datums
from tinkertrace.training.step import adam_params, train_step


def rows(versions: list[int | None], masks: list[list[int]], rollouts: list[str] | None = None) -> pa.Table:
    n = len(versions)
    return pa.table(
        {
            "rollout_id": rollouts or [f"r{i}" for i in range(n)],
            "action_mask": pa.array(masks, pa.list_(pa.int8())),
            "policy_version": pa.array(versions, pa.int64()),
        }
    )


def test_versions_repeat_the_row_version_without_the_per_token_column() -> None:
    table = rows([3, None, 5], [[0, 1, 1], [0, 1], [0, 0, 1, 0, 1, 1]])
    assert token_policy_versions(table).to_pylist() == [[3, 3], [None], [5, 5, 5]]


def test_versions_come_from_the_per_token_column_where_it_fits() -> None:
    table = rows([3, 4, 5], [[0, 1, 1], [0, 1], [0, 1, 1]])
    per_token = pa.array([[3, 4], None, [5]], pa.list_(pa.int64()))  # row 2: wrong length, row 1: absent
    table = table.append_column(VERSIONS_COLUMN, per_token)
    assert token_policy_versions(table).to_pylist() == [[3, 4], [4], [5, 5]]
    # a row is as old as its oldest token; unknown versions count as current
    assert row_ages(table, 6).tolist() == [3, 2, 1]
    assert row_ages(rows([None], [[0, 1]]), 6).tolist() == [0]


def test_drop_splits_a_group_but_correct_keeps_it_whole_or_drops_it_whole_and_remembers_it() -> None:
    table = rows([1, 3, 1, 1], [[0, 1]] * 4, ["a1", "a2", "b1", "b2"])
    keys = pa.array(["a", "a", "b", "b"])
    assert stale_rows(table, keys, 3, 1, "drop", set()).tolist() == [True, False, True, True]
    dropped: set[str] = set()
    # a keeps a1 as its baseline (a2 trains); b has nothing left to train and goes whole
    assert stale_rows(table, keys, 3, 1, "correct", dropped).tolist() == [False, False, True, True]
    assert dropped == {"b"}
    late = rows([3], [[0, 1]], ["b3"])  # a fresh rollout of the dropped group arrives later
    assert stale_rows(late, pa.array(["b"]), 3, 1, "correct", dropped).tolist() == [True]


def test_histograms_count_tokens_and_rollouts_by_age() -> None:
    table = rows([5, 4, 4, 0], [[0, 1, 1], [0, 1], [1, 1, 1], [0, 1]], ["x", "y", "y", "z"])
    per_token = pa.array([[5, 5], [4], [4, 5, 5], [0]], pa.list_(pa.int64()))
    metrics = staleness_metrics(table.append_column(VERSIONS_COLUMN, per_token), 5)
    tokens = [metrics[f"offpolicy/token_age_{a}"] for a in ("0", "1", "2", "3", "4+")]
    rollouts = [metrics[f"offpolicy/rollout_age_{a}"] for a in ("0", "1", "2", "3", "4+")]
    assert tokens == [4, 2, 0, 0, 1]
    assert rollouts == [1, 1, 0, 0, 1]  # y's oldest token is 1 version old
    assert metrics["offpolicy/multi_version_rollouts"] == 1  # y: versions 4 and 5
    assert metrics["offpolicy/token_age_mean"] == np.mean([0, 0, 1, 1, 0, 0, 5])


def test_a_rollout_of_several_segments_goes_stale_whole() -> None:
    """A long episode built as two segments (rows): its first turns by version 1, its last by 3. At
    step 3 with bound 1 the rollout is two versions old in both rows — before, only the first row was
    dropped and the second trained or dropped a step later, the rollout counted stale twice."""
    table = rows([1, 3, 3], [[0, 1]] * 3, ["long", "long", "short"])
    assert rollout_ages(table, 3).tolist() == [2, 2, 0]
    assert row_ages(table, 3).tolist() == [2, 0, 0]
    assert stale_rows(table, pa.array(["g", "g", "g"]), 3, 1, "drop", set()).tolist() == [True, True, False]


def test_target_ages_follow_the_datums_targets() -> None:
    """Ages line up with each Datum's targets (the row's tokens from the second on): prompt targets
    and cut tokens carry none, a response that changed version mid-decode gets each token's own age,
    and a row without a sampled token (no Datum) shifts nothing."""
    table = rows([2, 3, 1], [[0, 0, 1, 1, 1], [0, 0], [0, 1, 1, 0, 1]])
    table = table.append_column(VERSIONS_COLUMN, pa.array([[2, 3, 3], [], [1, 1, 1]], pa.list_(pa.int64())))
    tokens = pa.array([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12]], pa.list_(pa.int64()))
    logprobs = pa.array([[0.0] * 5, [0.0] * 2, [0.0] * 5], pa.list_(pa.float32()))
    batch = build_datums(tokens, logprobs, table["action_mask"], np.ones(3), loss_fn="ppo", max_tokens=3)
    assert batch.row_index.tolist() == [0, 2]  # row 1 has no sampled token; rows 0 and 2 cut to 3 targets
    ages = target_ages(table, batch, 3)
    assert [a.tolist() for a in ages] == [[0, 1, 0], [2, 2, 0]]
    assert [(a[m > 0]).tolist() for a, m in zip(ages, batch.masks, strict=True)] == [[1, 0], [2, 2]]


@pytest.fixture
def trainer(tmp_path: Path) -> object:
    service = ServiceClient(tmp_path / "engine", device="cpu", cpu_threads=1)
    return service.create_lora_training_client(f"{BUILTIN_MODEL}:nano", rank=4, seed=0).result()


def test_mismatch_kl_by_age_on_the_engine_separates_the_update_from_the_sampler(
    trainer: object, tmp_path: Path
) -> None:
    """Two responses whose decoding switched weights mid-way (in-flight), the first tokens sampled by
    version 0 and the rest by version 1, trained at step 1 on the real engine. The sampler logprobs
    are the engine's own under each version, so the age-0 tokens' KL is the sampler/trainer mismatch
    of the same weights (~0) and the age-1 tokens' is one update's drift; correct mode's forward pass
    gives the trainer's logprobs exactly (one alignment for both figures)."""
    tok = load_tokenizer(BUILTIN_MODEL)
    texts = [("Who are you? ", "I am a tiny chat model."), ("Name? ", "tinkertrace, at your service")]
    seqs = [tok.encode(p + r, add_special_tokens=False) for p, r in texts]
    prompt = [len(tok.encode(p, add_special_tokens=False)) for p, _ in texts]
    masks = [[0] * n + [1] * (len(s) - n) for s, n in zip(seqs, prompt, strict=True)]
    switch = [n + 4 for n in prompt]  # tokens from here on were sampled by version 1
    versions = [
        [0 if i < w else 1 for i in range(n, len(s))] for s, n, w in zip(seqs, prompt, switch, strict=True)
    ]

    def logprobs() -> list[np.ndarray]:  # each token's logprob under the trainer's current weights
        zeros = pa.array([[0.0] * len(s) for s in seqs])
        data = build_datums(pa.array(seqs), zeros, pa.array(masks), np.zeros(2), loss_fn="cross_entropy").data
        out = trainer.forward(data, "cross_entropy").result()  # type: ignore[attr-defined]
        return [np.r_[0.0, o["logprobs"].to_numpy()] for o in out.loss_fn_outputs]

    before = logprobs()
    config = TrainSettings(source=tmp_path, log_dir=tmp_path, loss="ppo", learning_rate=3e-2)
    update = build_datums(
        pa.array(seqs), pa.array([b.tolist() for b in before]), pa.array(masks), np.array([1.0, -1.0]),
        loss_fn="ppo",
    )  # fmt: skip
    train_step(trainer, update, config, adam_params(config))  # version 0 → 1
    after = logprobs()
    sampled = [
        np.where(np.arange(len(s)) < w, b, a) for s, w, b, a in zip(seqs, switch, before, after, strict=True)
    ]
    table = pa.table(
        {
            "rollout_id": ["a", "b"],
            "action_mask": pa.array(masks, pa.list_(pa.int8())),
            "policy_version": [0, 0],
            VERSIONS_COLUMN: pa.array(versions, pa.list_(pa.int64())),
        }
    )
    batch = build_datums(
        pa.array(seqs), pa.array([x.tolist() for x in sampled]), table["action_mask"], np.array([1.0, -1.0]),
        loss_fn="ppo",
    )  # fmt: skip
    ages = target_ages(table, batch, step=1)
    corrected = correct_batch(trainer, batch, "ppo", 2.0, ages)
    metrics = train_step(trainer, batch, config, adam_params(config), ages)

    assert metrics["offpolicy/mismatch_kl_age_0"] < 1e-9  # same weights, same forward pass
    old = zip(prompt, switch, before, after, strict=True)  # the tokens version 0 sampled: one update old
    drift = np.concatenate([(a - b)[n:w] for n, w, b, a in old])
    k3 = np.exp(drift) - 1 - drift
    assert metrics["offpolicy/mismatch_kl_age_1"] == pytest.approx(k3.mean(), rel=1e-4)
    assert metrics["offpolicy/mismatch_kl_age_1"] > 1e-4  # the update moved these tokens
    assert metrics["offpolicy/mismatch_kl"] == pytest.approx(corrected["offpolicy/mismatch_kl"], rel=1e-6)
    for age in ("0", "1"):  # the correction's pass reports by age too (the step's start, any substeps)
        key = f"offpolicy/mismatch_kl_age_{age}"
        assert corrected[key] == pytest.approx(metrics[key], rel=1e-6, abs=1e-12)


def test_correct_mode_bounds_each_token_a_long_episode_keeps_its_recent_turns() -> None:
    """A long episode (one rollout, two segments) whose first turn was sampled by version 1 and last
    by version 3, at step 3 with bound 1: drop mode drops the whole rollout by its oldest token;
    correct mode keeps it (its newest token is within the bound) and masks the old tokens instead,
    and drops a rollout (with its group) only once its newest token is over too."""
    table = rows([1, 3, 3, 0], [[0, 1]] * 4, ["long", "long", "short", "gone"])
    keys = pa.array(["g", "g", "g", "h"])
    assert rollout_ages(table, 3, newest=True).tolist() == [0, 0, 0, 3]
    assert row_ages(table, 3, newest=True).tolist() == [2, 0, 0, 3]
    assert stale_rows(table, keys, 3, 1, "drop", set()).tolist() == [True, True, False, True]
    dropped: set[str] = set()
    assert stale_rows(table, keys, 3, 1, "correct", dropped).tolist() == [False, False, False, True]
    assert dropped == {"h"}
    # within one row, a response whose decoding switched weights: its newest token decides
    table = rows([0], [[0, 1, 1, 1]], ["x"]).append_column(VERSIONS_COLUMN, pa.array([[0, 0, 2]]))
    assert row_ages(table, 2).tolist() == [2] and row_ages(table, 2, newest=True).tolist() == [0]


def test_correct_batch_gives_tokens_over_the_bound_no_advantage(trainer: object) -> None:
    """On the real engine: a response whose first tokens are 2 versions old and the rest current,
    bound 1. Sampled by the trainer's own weights (every weight 1), the corrected advantages are the
    advantage itself on the recent tokens and 0 on the old ones; the share masked is reported."""
    tok = load_tokenizer(BUILTIN_MODEL)
    seq = tok.encode("Who are you? I am a tiny chat model.", add_special_tokens=False)
    prompt = len(tok.encode("Who are you? ", add_special_tokens=False))
    mask = [0] * prompt + [1] * (len(seq) - prompt)
    zeros = pa.array([[0.0] * len(seq)])
    probe = build_datums(pa.array([seq]), zeros, pa.array([mask]), np.zeros(1), loss_fn="cross_entropy")
    own = trainer.forward(probe.data, "cross_entropy").result()  # type: ignore[attr-defined]
    logprobs = np.r_[0.0, own.loss_fn_outputs[0]["logprobs"].to_numpy()]
    versions = [0, 0, 0] + [2] * (len(seq) - prompt - 3)  # the first three sampled tokens by version 0
    table = pa.table(
        {
            "rollout_id": ["a"],
            "action_mask": pa.array([mask], pa.list_(pa.int8())),
            "policy_version": [0],
            VERSIONS_COLUMN: pa.array([versions], pa.list_(pa.int64())),
        }
    )
    batch = build_datums(
        pa.array([seq]), pa.array([logprobs.tolist()]), table["action_mask"], np.array([0.5]), loss_fn="ppo"
    )
    ages = target_ages(table, batch, step=2)
    metrics = correct_batch(trainer, batch, "ppo", 2.0, ages, bound=1)
    advantages = batch.data[0].loss_fn_inputs["advantages"].to_numpy()
    sampled = batch.masks[0] > 0
    old = sampled & (ages[0] > 1)
    assert old.sum() == 3 and (sampled & ~old).sum() == len(versions) - 3
    assert np.all(advantages[old] == 0)
    np.testing.assert_allclose(advantages[sampled & ~old], 0.5, rtol=1e-4)
    assert metrics["offpolicy/over_bound_frac"] == pytest.approx(3 / len(versions))
    # the mismatch figures are the trained tokens': the masked ones (age 2) are left out
    assert "offpolicy/mismatch_kl_age_0" in metrics and "offpolicy/mismatch_kl_age_2" not in metrics
    unbounded = build_datums(
        pa.array([seq]), pa.array([logprobs.tolist()]), table["action_mask"], np.array([0.5]), loss_fn="ppo"
    )
    correct_batch(trainer, unbounded, "ppo", 2.0, ages)  # no bound given: every token keeps its advantage
    np.testing.assert_allclose(
        unbounded.data[0].loss_fn_inputs["advantages"].to_numpy()[sampled], 0.5, rtol=1e-4
    )
