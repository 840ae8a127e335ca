"""tinker-cookbook's own RL and supervised loops, unchanged, against ``tinkertrace engine``.

Run by tests/engine_server/test_cookbook.py with the cookbook's environment (``.venv-cookbook``), with
``TINKER_BASE_URL`` / ``TINKER_API_KEY`` pointing at the engine:

    python cookbook_loops.py MODEL_NAME TOKENIZER_FOLDER WORK_FOLDER

MODEL_NAME is a recipe's model name that the engine serves through ``--model-alias``; the cookbook
finds its tokenizer through ``register_tokenizer`` (the cookbook's own hook for local tokenizers).
Prints one JSON line: what the loops left (their metrics, checkpoints, the runs' metadata).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import chz
import tinker
from tinker_cookbook import renderers, weights
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer, register_tokenizer
from transformers import AutoTokenizer

RENDERER = "role_colon"  # the cookbook's renderer for any tokenizer
QUESTIONS = [("Say yes.", "yes"), ("Say no.", "no"), ("Say hi.", "hi"), ("Say ok.", "ok")]


class SayEnv(ProblemEnv):
    """One question; reward 1 when the answer contains the word asked for."""

    def __init__(self, renderer: renderers.Renderer, question: str, answer: str) -> None:
        super().__init__(renderer, format_coef=0.0)
        self.question, self.answer = question, answer

    def get_question(self) -> str:
        return self.question

    def check_answer(self, sample_str: str) -> bool:
        return self.answer in sample_str.lower()

    def check_format(self, sample_str: str) -> bool:
        return True

    def get_reference_answer(self) -> str:
        return self.answer


class SayDataset(RLDataset):
    def __init__(self, model_name: str, batches: int, groups: int, group_size: int) -> None:
        self.renderer = renderers.get_renderer(RENDERER, get_tokenizer(model_name))
        self.batches, self.groups, self.group_size = batches, groups, group_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        picks = [QUESTIONS[(index * self.groups + g) % len(QUESTIONS)] for g in range(self.groups)]
        return [
            ProblemGroupBuilder(
                env_thunk=lambda q=q, a=a: SayEnv(self.renderer, q, a),
                num_envs=self.group_size,
                dataset_name="say",
            )
            for q, a in picks
        ]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class SayDatasetBuilder(RLDatasetBuilder):
    model_name: str
    batches: int = 3
    groups: int = 2
    group_size: int = 2

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return SayDataset(self.model_name, self.batches, self.groups, self.group_size), None


def _jsonl(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def run_rl(model_name: str, log_path: Path, max_steps: int) -> None:
    config = rl_train.Config(
        learning_rate=1e-3,
        dataset_builder=SayDatasetBuilder(model_name=model_name),
        model_name=model_name,
        recipe_name="tinkertrace_engine_test",
        renderer_name=RENDERER,
        max_tokens=6,
        log_path=str(log_path),
        eval_every=0,
        save_every=2,
        rolling_save_every=1,
        lora_rank=4,
        num_groups_to_log=0,
        max_steps=max_steps,
    )
    asyncio.run(rl_train.main(config))


def run_sl(model_name: str, log_path: Path, data_file: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in QUESTIONS
    ]
    data_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model_name, renderer_name=RENDERER, max_length=128, batch_size=2
    )
    config = sl_train.Config(
        log_path=str(log_path),
        model_name=model_name,
        recipe_name="tinkertrace_engine_test",
        renderer_name=RENDERER,
        dataset_builder=FromConversationFileBuilder(file_path=str(data_file), common_config=common),
        learning_rate=1e-2,
        lora_rank=4,
        save_every=0,
        eval_every=0,
        num_epochs=2,
    )
    asyncio.run(sl_train.main(config))


def main() -> None:
    model_name, tokenizer_folder, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    register_tokenizer(model_name, lambda: AutoTokenizer.from_pretrained(tokenizer_folder))
    rest = tinker.RestClient()

    run_rl(model_name, work / "rl", max_steps=2)
    first_rl = _jsonl(work / "rl" / "checkpoints.jsonl")
    run_rl(model_name, work / "rl", max_steps=3)  # resumes from the last checkpoint
    rl_checkpoints = _jsonl(work / "rl" / "checkpoints.jsonl")
    final_state = [c for c in rl_checkpoints if c["name"] == "final"][-1][
        "state_path"
    ]  # rolling ones may log later
    rl_run = rest.get_training_run_by_tinker_path(final_state).result()

    run_sl(model_name, work / "sl", work / "conversations.jsonl")
    sl_checkpoints = _jsonl(work / "sl" / "checkpoints.jsonl")
    exported = weights.download(tinker_path=final_state, output_dir=str(work / "exported"))

    print(
        json.dumps(
            {
                "rl_metrics": _jsonl(work / "rl" / "metrics.jsonl"),
                "rl_checkpoints_first_run": first_rl,
                "rl_checkpoints": rl_checkpoints,
                "rl_run": {
                    "id": rl_run.training_run_id,
                    "metadata": rl_run.user_metadata,
                    "base": rl_run.base_model,
                },
                "rl_listed": [
                    c.tinker_path
                    for run_id in sorted(
                        {path.split("/")[2] for path in [c["state_path"] for c in rl_checkpoints]}
                    )
                    for c in rest.list_checkpoints(run_id).result().checkpoints
                ],
                "sl_metrics": _jsonl(work / "sl" / "metrics.jsonl"),
                "sl_checkpoints": sl_checkpoints,
                "exported": sorted(p.name for p in Path(exported).iterdir()),
            }
        )
    )


if __name__ == "__main__":
    main()
