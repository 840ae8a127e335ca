"""bfloat16 for the weights that are not trained (chosen on a CUDA device that supports it, or by
``$TINKERTRACE_DTYPE``): checked here on the CPU, which computes bfloat16 too."""

from __future__ import annotations

import pytest
import torch

from tinkertrace.engine.model import DTYPE_ENV, ModelSpec, build_trainable, frozen_dtype, inference_copy

MODEL = "tinkertrace/tiny-chat:nano"


def test_the_default_is_float32_on_a_cpu_and_the_variable_can_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DTYPE_ENV, raising=False)
    assert frozen_dtype(torch.device("cpu")) == torch.float32
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    assert frozen_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setenv(DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="TINKERTRACE_DTYPE='fp8'"):
        frozen_dtype(torch.device("cpu"))


def test_a_bfloat16_base_trains_float32_adapters_and_merges_into_the_same_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    model = build_trainable(ModelSpec(MODEL, lora_rank=4, seed=0), torch.device("cpu"))
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}  # trained: float32
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}  # frozen base
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 2, 11]])
    targets = ids[:, 1:]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):  # a few steps on one sequence: the adapter moves the policy
        logprobs = torch.log_softmax(model(input_ids=ids[:, :-1]).logits.float(), -1)
        loss = -logprobs.gather(-1, targets.unsqueeze(-1)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    with torch.no_grad():
        trained = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        merged = torch.log_softmax(inference_copy(model)(input_ids=ids).logits.float(), -1)
        with model.disable_adapter():
            untrained = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    assert (trained - untrained).abs().max() > 0.05  # the adapter acts
    assert (merged - trained).abs().mean() < 0.02  # the merged bfloat16 sampler: the policy, to rounding


def test_full_fine_tuning_stays_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    model = build_trainable(ModelSpec(MODEL, lora_rank=0, seed=0), torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
