"""Counts of what a build read, built and left out (printed by the CLI, returned by the API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

NO_TOKENIZER_REASON = "no ids, text only: pass --tokenizer"


@dataclass
class BuildSummary:
    """What one build saw. Nothing is left out without being counted here."""

    files: int = 0
    corrupt_files: list[tuple[Path, str]] = field(default_factory=list)
    spans: int = 0
    spans_without_rollout: int = 0
    rollouts_seen: int = 0
    rollouts_excluded: int = 0  # in BuildSettings.exclude_rollouts (already built)
    rollouts_incomplete: dict[str, int] = field(default_factory=dict)  # reason -> count
    rollouts_status_filtered: int = 0  # left out by --status (counted before the other filters)
    rollouts_filtered: int = 0  # left out by --since/--until/--split/--task
    rollouts_built: int = 0
    rollouts_failed: int = 0  # built rollouts whose root says status failed (the agent raised)
    llm_spans: int = 0
    llm_duplicates: int = 0  # duplicate response ids and LLM spans nested in the same call
    llm_calls: int = 0  # distinct calls of the built rollouts
    llm_calls_filtered: int = 0  # left out by --agent / --min-policy-version
    llm_calls_without_tokens: int = 0
    llm_calls_without_logprobs: int = 0
    orphan_spans_repaired: int = 0  # parent missing: parent found again by time containment
    triplets: int = 0
    trajectories: int = 0
    trajectory_splits: dict[str, int] = field(default_factory=dict)  # split_reason -> count
    rewards: int = 0
    rewards_matched: int = 0
    rewards_unmatched: int = 0
    rewards_superseded: int = 0  # `final` policy: rewards other than the rollout's final one
    rewards_missing_dimension: int = 0  # --reward-name given but absent on the reward
    unmatched_rewards: list[tuple[str, str]] = field(default_factory=list)  # (rollout_id, span_id)
    rollout_ids: list[str] = field(default_factory=list)  # built rollouts, sorted
    incomplete_rollout_ids: list[str] = field(default_factory=list)  # left out as incomplete, sorted
    incomplete_rollouts_rewarded: int = 0  # of those, how many carried reward spans
    incomplete_included: bool = False  # --include-incomplete: they were built, not left out
    buckets: int = 1  # slices the token data was joined and sorted in (memory bound)
    spans_by_producer: dict[str, int] = field(default_factory=dict)  # tinkertrace, openinference, ...
    llm_spans_by_producer: dict[str, int] = field(default_factory=dict)  # LLM spans recognised, by producer
    llm_calls_retokenized: int = 0  # text-only calls given ids by --tokenizer
    llm_calls_not_rebuilt: dict[str, int] = field(default_factory=dict)  # reason -> text-only calls left
    triplets_by_token_source: dict[str, int] = field(default_factory=dict)  # server, retokenized, ...

    def hints(self) -> list[str]:
        """What to do when spans were read but no triplet was built (empty otherwise, and when the
        build's own filters left everything out: that is what was asked)."""
        filtered = self.rollouts_status_filtered + self.rollouts_filtered + self.rollouts_excluded
        if self.spans == 0 or self.triplets > 0 or filtered or self.llm_calls_filtered:
            return []
        hints = []
        text_only = self.llm_calls_not_rebuilt.get(NO_TOKENIZER_REASON, 0)
        if text_only:
            hints.append(
                f"{text_only} LLM spans carry text but no token ids: pass --tokenizer NAME_OR_FOLDER (the "
                "served model's tokenizer) to re-tokenise them, or have the endpoint return token ids "
                "(vLLM's return_token_ids; `tinkertrace serve` always does) and trace with OpenInference "
                "or tinkertrace's SDK"
            )
        for reason, count in sorted(self.llm_calls_not_rebuilt.items()):
            if reason != NO_TOKENIZER_REASON:
                hints.append(f"{count} LLM spans could not be rebuilt: {reason}")
        if not self.llm_spans_by_producer:
            seen = ", ".join(f"{k}: {v}" for k, v in sorted(self.spans_by_producer.items())) or "none"
            hints.append(
                f"no LLM span recognised among {self.spans} spans (by producer: {seen}); recognised are "
                "tinkertrace's SDK, OpenInference (openinference.span.kind = LLM), the GenAI conventions "
                "(gen_ai.operation.name = chat, ...; OpenLLMetry, opentelemetry-instrumentation-openai-v2 "
                "with message content on, Logfire) and Agent-lightning's spans"
            )
        if self.rollouts_seen == 0:
            hints.append("no rollout: no span carries a rollout id and no trace has a root span")
        elif self.rollouts_built == 0:
            hints.append(
                f"all {self.rollouts_seen} rollouts are incomplete (see the counts above); "
                "--include-incomplete builds them"
            )
        if self.llm_calls_without_tokens and not self.llm_calls_not_rebuilt:
            hints.append(f"{self.llm_calls_without_tokens} LLM calls have no token ids")
        return hints

    def incomplete_note(self) -> str | None:
        """What a build that left rollouts out as incomplete says about them (None when it left none)."""
        if self.incomplete_included or not self.incomplete_rollout_ids:
            return None
        count = len(self.incomplete_rollout_ids)
        shown = ", ".join(self.incomplete_rollout_ids[:10]) + (", ..." if count > 10 else "")
        return (
            f"{count} rollouts left out as incomplete ({shown}), {self.incomplete_rollouts_rewarded} of them "
            "with rewards: a rollout recorded by an endpoint is complete once it is finished "
            "(POST /v1/rollouts/{id}/finish); --include-incomplete builds them as they are"
        )

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for printing."""

        def by_reason(counts: dict[str, int]) -> str:
            return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "0"

        return [
            ("files read", str(self.files)),
            ("corrupt files skipped", str(len(self.corrupt_files))),
            ("spans", str(self.spans)),
            ("spans without rollout", str(self.spans_without_rollout)),
            ("rollouts seen", str(self.rollouts_seen)),
            ("rollouts built", str(self.rollouts_built)),
            ("rollouts built that failed", str(self.rollouts_failed)),
            ("rollouts left out by status", str(self.rollouts_status_filtered)),
            (
                "rollouts incomplete (built)"
                if self.incomplete_included
                else "rollouts incomplete (left out)",
                by_reason(self.rollouts_incomplete),
            ),
            ("rollouts incomplete with rewards", str(self.incomplete_rollouts_rewarded)),
            ("rollouts filtered out", str(self.rollouts_filtered)),
            ("rollouts already built (excluded)", str(self.rollouts_excluded)),
            ("LLM spans", str(self.llm_spans)),
            ("LLM duplicate/nested spans dropped", str(self.llm_duplicates)),
            ("LLM calls", str(self.llm_calls)),
            ("LLM calls filtered out", str(self.llm_calls_filtered)),
            ("LLM calls without token ids (skipped)", str(self.llm_calls_without_tokens)),
            ("LLM calls without logprobs (logprob 0)", str(self.llm_calls_without_logprobs)),
            ("orphan spans repaired", str(self.orphan_spans_repaired)),
            ("triplets", str(self.triplets)),
            ("trajectories", str(self.trajectories)),
            ("trajectory splits", by_reason(self.trajectory_splits)),
            ("rewards", str(self.rewards)),
            ("rewards matched", str(self.rewards_matched)),
            ("rewards unmatched", str(self.rewards_unmatched)),
            ("rewards superseded (final policy)", str(self.rewards_superseded)),
            ("rewards missing the named dimension", str(self.rewards_missing_dimension)),
            ("spans by producer", by_reason(self.spans_by_producer)),
            ("LLM spans by producer", by_reason(self.llm_spans_by_producer)),
            ("LLM calls re-tokenised (--tokenizer)", str(self.llm_calls_retokenized)),
            ("LLM calls not rebuilt", by_reason(self.llm_calls_not_rebuilt)),
            ("triplets by token source", by_reason(self.triplets_by_token_source)),
            ("token buckets (memory bound)", str(self.buckets)),
        ]

    def __str__(self) -> str:
        width = max(len(label) for label, _ in self.rows())
        return "\n".join(f"{label:<{width}}  {value}" for label, value in self.rows())
