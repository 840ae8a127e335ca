"""The vectorised prefix comparison of consecutive turns against a per-pair reference."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tinkertrace.builder.trajectories import DRIFT_WINDOW, _first_mismatch, _Lists, _resyncs


def _reference(prompts: list[list[int]], responses: list[list[int]], prev: int, cur: int) -> int:
    a, b = prompts[prev] + responses[prev], prompts[cur]
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def test_first_mismatch_matches_reference_on_random_turns() -> None:
    rng = np.random.default_rng(7)
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    for _ in range(300):
        prev_p = prompts[-1] if prompts else []
        prev_r = responses[-1] if responses else []
        base = prev_p + prev_r
        choice = rng.integers(0, 5)
        if choice == 0:  # extends the previous prompt + response
            prompt = base + list(rng.integers(0, 4, rng.integers(0, 4)))
        elif choice == 1 and base:  # one token changed (inside prompt or response)
            prompt = list(base)
            prompt[int(rng.integers(0, len(base)))] += 1
        elif choice == 2:  # stops early (a prefix of the previous context)
            prompt = base[: int(rng.integers(0, len(base) + 1))]
        else:  # unrelated
            prompt = list(rng.integers(0, 4, rng.integers(0, 8)))
        prompts.append([int(x) for x in prompt])
        responses.append([int(x) for x in rng.integers(0, 4, rng.integers(0, 5))])
    p = _Lists(pa.array(prompts, pa.list_(pa.int32())))
    r = _Lists(pa.array(responses, pa.list_(pa.int32())))
    cur = np.arange(1, len(prompts))
    got = _first_mismatch(p, r, cur - 1, cur)
    want = [_reference(prompts, responses, int(c) - 1, int(c)) for c in cur]
    assert got.tolist() == want


def _resync_reference(x: list[int], y: list[int], at: int) -> bool:
    if len(x) - at <= DRIFT_WINDOW:
        return True
    return any(
        x[at + a :] == y[at + b : at + b + len(x) - at - a]
        for a in range(1, DRIFT_WINDOW + 1)
        for b in range(1, DRIFT_WINDOW + 1)
    )


def test_resyncs_matches_reference_on_random_breaks() -> None:
    rng = np.random.default_rng(11)
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    for _ in range(400):
        base = (prompts[-1] + responses[-1]) if prompts else [1]
        at = int(rng.integers(0, len(base)))
        a, b = (int(v) for v in rng.integers(0, DRIFT_WINDOW + 2, 2))
        region = [int(v) for v in rng.integers(5, 9, b)]  # never equal to the skipped tokens (< 5)
        more = [int(v) for v in rng.integers(0, 5, rng.integers(0, 3))]
        prompt = base[:at] + region + base[at + a :] + more
        prompts.append(prompt)
        responses.append([int(v) for v in rng.integers(0, 5, rng.integers(0, 6))])
    p = _Lists(pa.array(prompts, pa.list_(pa.int32())))
    r = _Lists(pa.array(responses, pa.list_(pa.int32())))
    cur = np.arange(1, len(prompts))
    at = _first_mismatch(p, r, cur - 1, cur)
    x_len = p.lengths[cur - 1] + r.lengths[cur - 1]
    broken = at < x_len
    got = _resyncs(p, r, cur[broken] - 1, cur[broken], at[broken])
    want = [
        _resync_reference(prompts[c - 1] + responses[c - 1], prompts[c], int(t))
        for c, t in zip(cur[broken], at[broken], strict=True)
    ]
    assert got.tolist() == want
    assert 0 < sum(want) < len(want)  # both outcomes are exercised
