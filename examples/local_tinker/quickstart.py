"""A Tinker script that uses only the public ``tinker`` SDK: train a LoRA adapter to give one answer,
save it, sample from it, and resume the run from its saved state.

It runs unchanged on hosted Tinker or against ``tinkertrace engine`` on this machine:

    tinkertrace engine --port 8100 &
    TINKER_BASE_URL=http://127.0.0.1:8100 TINKER_API_KEY=tml-local python examples/local_tinker/quickstart.py

Set ``BASE_MODEL`` to a Tinker model name (e.g. ``Qwen/Qwen3-8B``) to run it on hosted Tinker.
"""

from __future__ import annotations

import json
import os

import tinker
from tinker import types

BASE_MODEL = os.environ.get("BASE_MODEL", "tinkertrace/tiny-chat")
STEPS = int(os.environ.get("STEPS", "20"))
QUESTION, ANSWER = "What is the capital of France?", "Paris"


def chat_example(tokenizer: object) -> tuple[list[int], types.Datum]:
    """The prompt tokens, and a Datum that teaches ANSWER after them (loss on the answer only)."""
    messages = [{"role": "user", "content": QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    answer = tokenizer.encode(ANSWER + (tokenizer.eos_token or ""), add_special_tokens=False)
    tokens = list(prompt) + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )
    return list(prompt), datum


def main() -> dict[str, object]:
    service = tinker.ServiceClient()  # TINKER_BASE_URL and TINKER_API_KEY come from the environment
    trainer = service.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result()
    tokenizer = trainer.get_tokenizer()
    prompt, datum = chat_example(tokenizer)
    adam = types.AdamParams(learning_rate=3e-3)

    losses = []
    for step in range(STEPS):
        fwd_bwd = trainer.forward_backward([datum], "cross_entropy")  # both submitted before waiting
        optim = trainer.optim_step(adam)
        losses.append(fwd_bwd.result().metrics["loss:sum"])
        optim.result()
        if step == STEPS // 2 - 1:
            state_path = trainer.save_state("halfway").result().path

    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[tokenizer.eos_token or "\n"])
    sample = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    answer = tokenizer.decode(sample.tokens, skip_special_tokens=True)

    # Resume the run from its halfway state, optimizer included, and take one more step.
    resumed = service.create_training_client_from_state_with_optimizer(state_path).result()
    resumed_loss = resumed.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"]
    service.close("success").result()
    return {
        "base_model": BASE_MODEL,
        "losses": losses,
        "answer": answer,
        "state_path": state_path,
        "resumed_loss": resumed_loss,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
