"""What one evaluation run does (``tinkertrace eval``, :func:`tinkertrace.evaluation.evaluate`).

Every setting is declared once, with its help text; the command makes its options from these fields
(``tinkertrace.cli.options``). Light on purpose: the command line imports it to build its help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tinkertrace.models.builtin import BUILTIN_MODEL
from tinkertrace.settings import raise_problems, setting


@dataclass
class EvalSettings:
    """An agent run over every task of a split, several times, without training."""

    agent: str = setting(
        help="The agent function, as path/to/file.py:function or package.module:function.", argument=True
    )
    tasks: str = setting(help="The task source, path/to/file.py:function or module:function (takes split=).")
    split: str = setting("test", "Which split of the task source to evaluate.")
    openreward: str | None = setting(
        None,
        "An OpenReward environment (URL, or NAME with $OPENREWARD_URL) for the ORS agent and task source "
        "(tinkertrace.ors.agent:run_episode --tasks tinkertrace.ors.agent:load_tasks).",
    )
    agent_kwargs: dict[str, str] = setting(
        help="Further agent argument KEY=VALUE, repeatable (values read as YAML scalars: 2, true, text).",
        default_factory=dict,
    )
    samples_per_task: int = setting(4, "Rollouts per task (n in pass@k).", flags=("--samples-per-task", "-n"))
    k: str = setting("1", "Comma-separated k values for pass@k, each <= samples per task.")
    base_url: str | None = setting(
        None, "OpenAI-compatible endpoint (…/v1). Default: start a local endpoint serving --model."
    )
    model: str = setting(BUILTIN_MODEL, "Model name sent to the endpoint (and served locally).")
    api_key: str = setting("EMPTY", "API key for the endpoint.", envvar="OPENAI_API_KEY")
    temperature: float | None = setting(
        None, "Sampling temperature passed to the agent (default: the agent's)."
    )
    max_tasks: int | None = setting(None, "Evaluate only the first N tasks.")
    concurrency: int = setting(8, "Rollouts running at once.")
    success_threshold: float = setting(1.0, "A rollout passes when its reward is at least this.")
    spans_dir: Path | None = setting(
        None, "Spans folder for the rollouts' traces (default: <out stem>.spans/ next to --out)."
    )
    out: Path = setting(
        Path("eval_results.jsonl"),
        "JSONL file, one line per rollout; the summary goes next to it as <name>.summary.json.",
    )

    @property
    def ks(self) -> list[int]:
        """The k values of pass@k, sorted."""
        return sorted({int(part) for part in self.k.split(",") if part.strip()})

    def validate(self) -> EvalSettings:
        """Check ranges; returns self (ConfigError naming every problem otherwise)."""
        try:
            ks = self.ks
        except ValueError:
            ks = []  # reported below
        bad_k = [k for k in ks if not 1 <= k <= self.samples_per_task]
        checks = [
            (self.samples_per_task >= 1, "samples_per_task must be at least 1"),
            (self.concurrency >= 1, "concurrency must be at least 1"),
            (self.max_tasks is None or self.max_tasks >= 1, "max_tasks must be at least 1"),
            (bool(ks), f"--k must be comma-separated whole numbers, got {self.k!r}"),
            (not bad_k, f"k values {bad_k} need 1 <= k <= samples per task ({self.samples_per_task})"),
        ]
        raise_problems(checks, "invalid eval settings")
        return self
