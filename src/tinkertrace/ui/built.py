"""What the trainer sees of one rollout: its triplets and trajectories, and the advantage each got.

The rollout's task group is built from its span files with the public builder
(:func:`tinkertrace.builder.build_trajectories`, in memory: nothing is written into the run folder),
under the reward policy asked for: what ``tinkertrace train`` builds from the same spans (the
builder is deterministic). Advantages come from the trainer's own
:func:`tinkertrace.training.dataset.prepare` over the group's rows.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace import schemas
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.builder.options import REWARD_POLICIES
from tinkertrace.training.dataset import prepare
from tinkertrace.training.errors import DataError
from tinkertrace.ui.index import RunIndex
from tinkertrace.ui.sources import CONFIG_FILE, read_json

DEFAULT_POLICY = "nearest"  # what `tinkertrace train` and follow mode build with
CACHE_ENTRIES = 32


@dataclass
class BuiltRollout:
    """One rollout as built: its calls (triplets), its trajectory rows, and where they came from."""

    rollout_id: str
    policy: str
    source: str  # which span files it was built from, under which policy
    triplets: list[dict[str, Any]]
    trajectories: list[dict[str, Any]]  # with an "advantage" per row (None when not computable)
    advantage_note: str
    group_advantages: dict[str, list[float]] = field(default_factory=dict)  # rollout -> its rows' advantages
    unmatched_reward_spans: set[str] = field(default_factory=set)
    incomplete: bool = False  # the builder left the rollout out as incomplete


def run_settings(index: RunIndex) -> dict[str, Any]:
    """The training settings of the run (the first log folder's config.json), {} when none."""
    for log_dir in index.sources.log_dirs:
        if config := read_json(log_dir / CONFIG_FILE):
            return config
    return {}


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.drop_columns([c for c in ("end_time",) if c in table.column_names]).to_pylist()


def _advantages(group: pa.Table, settings: dict[str, Any]) -> tuple[dict[Any, float], str]:
    """(rollout, agent, segment) -> advantage of each row of the group, as the trainer computes it."""
    mode = str(settings.get("advantage", "group"))
    group_by = str(settings.get("group_by", "task"))
    try:
        data = prepare(group, group_by=group_by, advantage=mode, remove_constant_reward_groups=False)
    except DataError as exc:
        return {}, f"no advantage: {exc}"
    table = data.table
    keys = zip(
        table["rollout_id"].to_pylist(),
        table["agent_name"].to_pylist(),
        table["segment"].to_pylist(),
        strict=True,
    )
    values = {key: float(a) for key, a in zip(keys, data.advantage_of_row, strict=True)}
    size = len(set(group["rollout_id"].to_pylist()))
    note = f"advantage '{mode}' within the group of {size} rollouts (group key: {group_by})"
    if len(set(group["reward"].to_pylist())) <= 1 and settings.get("remove_constant_reward_groups", True):
        note += "; every reward in the group is equal, so the trainer leaves this group out"
    return values, note


class RolloutBuilds:
    """Built rollouts, cached by (rollout, policy, span files)."""

    def __init__(self, index: RunIndex, entries: int = CACHE_ENTRIES) -> None:
        self.index = index
        self.entries = entries
        self._cache: OrderedDict[tuple[Any, ...], BuiltRollout] = OrderedDict()
        self._lock = threading.Lock()  # pages run on several threads

    def get(self, rollout_id: str, policy: str = DEFAULT_POLICY) -> BuiltRollout:
        if policy not in REWARD_POLICIES:
            raise ValueError(f"unknown reward policy {policy!r}; choose one of {', '.join(REWARD_POLICIES)}")
        row = self.index.rollout(rollout_id)
        if row is None:
            raise KeyError(rollout_id)
        group = self.index.rollouts_of_task(row["task_id"], rollout_id)
        files = tuple(self.index.files_of(group))
        key = (rollout_id, policy, files)  # a live run's new files make a new key
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        built = self._build(rollout_id, row["task_id"], policy, files)
        with self._lock:
            self._cache[key] = built
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        return built

    def _build(
        self, rollout_id: str, task_id: str | None, policy: str, files: tuple[Path, ...]
    ) -> BuiltRollout:
        spans_dir = next(
            (d for d in self.index.sources.spans_dirs if files and files[0].is_relative_to(d)), None
        )
        if spans_dir is None:
            empty = schemas.trajectories().empty_table()
            return self._assemble(rollout_id, policy, "no span files", empty, pa.table({}), set(), True)
        options = BuildSettings(
            files=files,
            tasks=(task_id,) if task_id is not None else (),
            reward_policy=policy,  # type: ignore[arg-type]
            group_by=str(run_settings(self.index).get("group_by", "task")),  # type: ignore[arg-type]
        )
        result = build_trajectories(spans_dir, None, options)
        summary = result.summary
        unmatched = {span for rid, span in summary.unmatched_rewards if rid == rollout_id}
        triplets = result.triplets.filter(pc.equal(result.triplets["rollout_id"], rollout_id))
        group_rows = result.trajectories
        if task_id is None:
            group_rows = group_rows.filter(pc.equal(group_rows["rollout_id"], rollout_id))
        else:
            mine = group_rows.filter(pc.equal(group_rows["rollout_id"], rollout_id))
            if mine.num_rows:
                group_rows = group_rows.filter(pc.is_in(group_rows["group_key"], value_set=mine["group_key"]))
        incomplete = rollout_id in summary.incomplete_rollout_ids
        source = (
            f"built now from {len(files)} span file{'s' if len(files) != 1 else ''} (reward policy {policy})"
        )
        return self._assemble(rollout_id, policy, source, group_rows, triplets, unmatched, incomplete)

    def _assemble(
        self, rollout_id: str, policy: str, source: str, group: pa.Table, triplets: pa.Table,
        unmatched: set[str], incomplete: bool,
    ) -> BuiltRollout:  # fmt: skip
        mine = group.filter(pc.equal(group["rollout_id"], rollout_id)) if group.num_rows else group
        mine = (
            mine.sort_by([("agent_name", "ascending"), ("segment", "ascending")]) if mine.num_rows else mine
        )
        rows = _rows(mine)
        values: dict[Any, float] = {}
        note = "no trajectory"
        if group.num_rows:
            values, note = _advantages(group, run_settings(self.index))
        for row in rows:
            row["advantage"] = values.get((rollout_id, row["agent_name"], row["segment"]))
        per_rollout: dict[str, list[float]] = {}
        for (rid, _, _), value in values.items():
            if value not in per_rollout.setdefault(rid, []):
                per_rollout[rid].append(value)
        trips = _rows(triplets) if triplets.num_columns else []
        return BuiltRollout(rollout_id, policy, source, trips, rows, note, per_rollout, unmatched, incomplete)


@functools.lru_cache(maxsize=8)
def _decoder(model: str) -> Any:
    from tinkertrace.models.tokenizer import load_tokenizer

    return load_tokenizer(model)


def token_texts(model: str | None, ids: list[int]) -> tuple[list[str] | None, str]:
    """Each token's text (decoded alone), or None with the reason when the model's tokenizer is not here."""
    if not model:
        return None, "no model name on the calls"
    try:
        tokenizer = _decoder(model)
    except Exception as exc:  # a hosted model name, a folder that moved: show ids only
        return None, f"tokenizer of {model!r} not available here ({exc.__class__.__name__})"
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return [_visible(t) for t in texts], ""


def _visible(text: str) -> str:
    """Control characters as ``\\xNN`` (a sampled byte may be one); newlines and tabs kept."""
    return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)


@dataclass
class TokenView:
    """A trajectory (one agent of one rollout, all its segments) token by token."""

    agent: str | None
    segments: list[dict[str, Any]]  # per segment: split_reason, reward, advantage, fate, tokens (dicts)
    total_tokens: int
    trained_tokens: int  # went into a Datum that a step trained
    sampled_tokens: int  # action mask 1
    retokenized_tokens: int
    text_note: str


def _fate_text(fate: dict[str, Any] | None) -> str:
    if fate is None:
        return "not trained"
    if fate["steps"]:
        steps = ", ".join("?" if s is None else str(s) for s in fate["steps"])
        return f"trained at step {steps}"
    when = f" at step {fate['drop_step']}" if fate["drop_step"] is not None else ""
    return f"dropped: {fate['reason']}{when}"


def _trained_positions(fate: dict[str, Any] | None, n: int) -> range:
    """Positions whose token a step trained (when sampled): a Datum targets tokens 1 .. kept - 1."""
    if fate is None or not fate["steps"]:
        return range(0)
    return range(1, min(n, fate["tokens"] if fate["tokens"] is not None else n))


def token_view(
    built: BuiltRollout, agent: str | None, fates: dict[tuple[Any, Any], dict[str, Any]] | None = None
) -> TokenView:
    """Per-token rows of ``agent``'s trajectory: text, id, sampled (mask 1) and trained (in a Datum a
    step trained, from the trainer's ``outcomes.jsonl``: ``fates`` by (agent, segment)), sampler
    logprob, advantage on sampled tokens, the turn it came from and whether its call was re-tokenised."""
    fates = fates or {}
    rows = [r for r in built.trajectories if r["agent_name"] == agent]
    calls = [t for t in built.triplets if t["agent_name"] == agent]
    model = next((t["model"] for t in calls if t.get("model")), None)
    turn_of = _turn_positions(rows, calls)
    segments, total, trained, sampled, retok = [], 0, 0, 0, 0
    text_note = ""
    for row, turn_positions in zip(rows, turn_of, strict=True):
        texts, text_note = token_texts(model, row["tokens"])
        fate = fates.get((row["agent_name"], row["segment"]), fates.get((None, None)))
        in_datum = _trained_positions(fate, len(row["tokens"]))
        tokens = []
        for i, (tid, lp, mask) in enumerate(
            zip(row["tokens"], row["logprobs"], row["action_mask"], strict=True)
        ):
            call = turn_positions[i] if turn_positions else None
            source = call["token_source"] if call else None
            tokens.append(
                {
                    "i": i,
                    "id": tid,
                    "text": texts[i] if texts else None,
                    "sampled": bool(mask),
                    "trained": bool(mask) and i in in_datum,
                    "logprob": float(lp) if mask else None,
                    "advantage": row.get("advantage") if mask and row.get("advantage") is not None else None,
                    "turn": call["turn"] if call else None,
                    "span": call["span_id"] if call else None,
                    "retokenized": source == "retokenized",
                    "parts": False,
                }
            )
        total += len(tokens)
        trained += sum(t["trained"] for t in tokens)
        sampled += sum(t["sampled"] for t in tokens)
        retok += sum(t["retokenized"] for t in tokens)
        segments.append(
            {
                **{k: v for k, v in row.items() if k not in ("tokens", "logprobs", "action_mask")},
                "fate": _fate_text(fate),
                "tokens": tokens,
            }
        )
    _mark_partings(rows, segments)
    return TokenView(agent, segments, total, trained, sampled, retok, text_note)


def _mark_partings(rows: list[dict[str, Any]], segments: list[dict[str, Any]]) -> None:
    """On each segment after the first, the token where its sequence parts from the previous
    segment's (what the split is about: a changed template or history): ``parted_at`` and the
    token's ``parts`` flag; None when one sequence is a prefix of the other."""
    for k in range(1, len(rows)):
        before, now = rows[k - 1]["tokens"], rows[k]["tokens"]
        n = min(len(before), len(now))
        differ = np.flatnonzero(np.asarray(before[:n]) != np.asarray(now[:n]))
        at = int(differ[0]) if len(differ) else None
        segments[k]["parted_at"] = at
        if at is not None:
            segments[k]["tokens"][at]["parts"] = True


def _turn_positions(
    rows: list[dict[str, Any]], calls: list[dict[str, Any]]
) -> list[list[dict[str, Any]] | None]:
    """For each segment, the call each token position came from (segments take ``num_turns`` calls in
    turn order; a turn adds its new prompt tokens and its response). None where the lengths disagree."""
    out: list[list[dict[str, Any]] | None] = []
    k = 0
    for row in rows:
        taken = calls[k : k + int(row["num_turns"])]
        k += int(row["num_turns"])
        owner: list[dict[str, Any]] = []
        for call in taken:
            end = len(call["prompt_token_ids"]) + len(call["response_token_ids"])
            owner += [call] * max(0, end - len(owner))
        out.append(owner if len(owner) == len(row["tokens"]) else None)
    return out


def agents_of(built: BuiltRollout) -> list[str | None]:
    """The agents that have a trajectory in the rollout, in order."""
    return list(dict.fromkeys(r["agent_name"] for r in built.trajectories))
