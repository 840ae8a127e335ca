"""Publishing a version on the hosted path: Tinker's inflight form vs a snapshot loaded by path.

The unchanged ``tinker`` SDK against ``tinkertrace engine`` (in this process, on a loopback port):
one LoRA training client, and two endpoints' ``PolicyHolder``s sampling through the SDK, one with
``inflight="keep-cache"`` (each version comes as a ``kind="inflight"`` sampling client) and one with
``inflight="off"`` (each version's sampler path is loaded as a snapshot). Per round, both get a new
version in turn (order alternating): an optimizer step, the snapshot save every step makes, then
``publish_version`` — the time of the last is what is reported, per mode.

    .venv/bin/python benchmarks/hosted_publish.py --model tinkertrace/tiny-chat:small --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import record
import tinker
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.engine_server import EngineSettings, create_app
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.online.publish import holder_publisher, publish_version
from tinkertrace.serving.policy import policy_from_service

MEASURES = (
    "src/tinkertrace/online",
    "src/tinkertrace/serving",
    "src/tinkertrace/engine",
    "src/tinkertrace/engine_server",
)

KEY = "tml-hosted-publish-benchmark"
TEXT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello there<|im_end|>\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=f"{BUILTIN_MODEL}:small")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rank", type=int, default=8)
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    os.environ["TINKER_API_KEY"] = KEY
    ids = load_tokenizer(args.model).encode(TEXT)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    engine = ServiceClient(tempfile.mkdtemp(prefix="hosted-publish-"), device="cpu", cpu_threads=1)
    with BackgroundServer(create_app(engine, EngineSettings(retrieve_poll_s=5.0))) as server:
        sdk = tinker.ServiceClient(base_url=server.url, api_key=KEY)
        trainer = sdk.create_lora_training_client(base_model=args.model, rank=args.rank, seed=0).result()
        holders = {
            mode: policy_from_service(sdk, args.model, inflight=mode) for mode in ("keep-cache", "off")
        }
        seconds: dict[str, list[float]] = {mode: [] for mode in holders}
        saves: list[float] = []
        version = 0
        for round_ in range(args.rounds):
            order = list(holders) if round_ % 2 == 0 else list(reversed(holders))
            for mode in order:
                version += 1
                trainer.forward_backward([datum], "cross_entropy").result()
                trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()
                started = time.perf_counter()
                path = trainer.save_weights_for_sampler(f"step_{version:06d}").result().path
                saved = time.perf_counter()
                published = {"sampler_path": path, "policy_version": version}
                publish_version(holder_publisher(holders[mode]), trainer, published)
                seconds[mode].append(time.perf_counter() - saved)
                saves.append(saved - started)
        for mode, values in seconds.items():
            listed = " ".join(f"{v:.3f}" for v in values)
            median = statistics.median(values)
            print(f"{mode:10} ({holders[mode].sampler_kind}): publish median {median:.3f} s  [{listed}]")
            what = f"inflight={mode}: publish_version, median of {args.rounds}, {args.model}"
            result.add(f"{record.slug(mode)}_publish_s", median, "s", what)
        print(f"snapshot save (every step, both modes): median {statistics.median(saves):.3f} s")
        result.add("snapshot_save_s", statistics.median(saves), "s", "snapshot save (every step), median")
        sdk.close("success").result(timeout=30)
    result.save()


if __name__ == "__main__":
    main()
