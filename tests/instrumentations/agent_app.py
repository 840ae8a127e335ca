"""A three-call agent traced only by a stock instrumentation, as a new user would write it.

Run by ``.venv-instrumentations/bin/python`` (built by ``make instrumentations-env``), never imported by
the main test environment. Each rollout is one root span of the app's own tracer (task key
``task.id``) around a plain chat call, a call offering a tool and a streaming call; the reward is
written the GenAI way: a ``gen_ai.evaluation.result`` event on the root span (an OTLP log record of
it in the ``openai-v2-events`` and ``openai-v2-messages`` modes) and a span of that name linked to the
tool call by ``gen_ai.response.id``.
Spans leave with the stock OTLP/HTTP exporter.

    python agent_app.py INSTRUMENTATION COLLECTOR_URL MODEL_URL ROLLOUTS [--with-sdk]
"""

from __future__ import annotations

import argparse
import json
import os

INSTRUMENTATIONS = (
    "openinference", "openllmetry", "openai-v2", "openai-v2-events", "openai-v2-messages", "logfire",
)  # fmt: skip
TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def _otlp_provider(collector: str):
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "stock-agent"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=collector + "/v1/traces")))
    trace.set_tracer_provider(provider)
    return provider


def _otlp_logs(collector: str):
    from opentelemetry._logs import set_logger_provider
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = LoggerProvider()
    provider.add_log_record_processor(
        BatchLogRecordProcessor(OTLPLogExporter(endpoint=collector + "/v1/logs"))
    )
    set_logger_provider(provider)
    return provider


def instrument(name: str, collector: str, client: object) -> list[object]:
    """Set up ``name``'s instrumentation exporting to ``collector``; returns what to flush at exit."""
    if name == "logfire":
        import logfire
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter = BatchSpanProcessor(OTLPSpanExporter(endpoint=collector + "/v1/traces"))
        logfire.configure(
            send_to_logfire=False, console=False, service_name="stock-agent",
            additional_span_processors=[exporter],
        )  # fmt: skip
        logfire.instrument_openai(client)
        return [exporter]
    flush: list[object] = [_otlp_provider(collector)]
    if name == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif name == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    elif name == "openai-v2-messages":  # the official one's default mode: one log event per message
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
        flush.append(_otlp_logs(collector))
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    else:  # the official instrumentation, latest conventions: content on the span, or as OTLP log records
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
        mode = "event_only" if name.endswith("events") else "span_only"
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = mode
        if mode == "event_only":
            flush.append(_otlp_logs(collector))
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
    return flush


def run_rollout(client: object, tracer: object, model: str, index: int, *, logs: bool = False) -> dict:
    """One rollout: three calls under a root span, then the rewards; returns what the agent saw."""
    question = f"What is {index} + {index}?"
    with tracer.start_as_current_span("episode", attributes={"task.id": f"task-{index % 4}"}) as root:
        messages = [{"role": "user", "content": question}]
        plain = client.chat.completions.create(model=model, messages=messages)
        tool = client.chat.completions.create(model=model, messages=messages, tools=[TOOL])
        chunks = client.chat.completions.create(
            model=model, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reward = 1.0 if str(2 * index) in streamed else 0.0
        score = {"gen_ai.evaluation.name": "correct", "gen_ai.evaluation.score.value": reward}
        if logs:  # the event as an OTLP log record of the root span (the logs API's events)
            from opentelemetry._logs import get_logger

            get_logger("stock-agent").emit(event_name="gen_ai.evaluation.result", attributes=score)
        else:
            root.add_event("gen_ai.evaluation.result", score)
        attributes = {
            "gen_ai.evaluation.name": "used_tool",
            "gen_ai.evaluation.score.value": 1.0 if tool.choices[0].message.tool_calls else 0.0,
            "gen_ai.response.id": tool.id,
        }
        with tracer.start_as_current_span("gen_ai.evaluation.result", attributes=attributes):
            pass
    return {"plain": plain.id, "tool": tool.id, "streamed": streamed, "reward": reward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("instrumentation", choices=INSTRUMENTATIONS)
    parser.add_argument("collector", help="the collector's base URL, e.g. http://127.0.0.1:4318")
    parser.add_argument("model_url", help="the OpenAI-compatible endpoint's base URL (…/v1)")
    parser.add_argument("rollouts", type=int)
    parser.add_argument("--model", default="test-model")
    parser.add_argument("--with-sdk", action="store_true", help="also trace with tinkertrace's SDK")
    args = parser.parse_args()

    import openai
    from opentelemetry import trace

    client = openai.OpenAI(base_url=args.model_url, api_key="unused")
    flush = instrument(args.instrumentation, args.collector, client)
    tracer = trace.get_tracer("stock-agent")
    results = []
    if args.with_sdk:  # our SDK beside the stock instrumentation, in the same process and provider
        import tinkertrace

        tinkertrace.init(endpoint=args.collector)
        rollout = tinkertrace.traced_rollout(lambda task: run_rollout(client, tracer, args.model, task["n"]))
        results = [rollout({"id": f"task-{i % 4}", "n": i}) for i in range(args.rollouts)]
        tinkertrace.flush()
    else:
        logs = args.instrumentation in ("openai-v2-events", "openai-v2-messages")
        results = [run_rollout(client, tracer, args.model, i, logs=logs) for i in range(args.rollouts)]
    for item in flush:
        item.force_flush()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
