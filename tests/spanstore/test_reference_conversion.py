"""The fast raw-attribute conversion path (``body_to_table``) against the generated protobuf classes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from tinkertrace import semconv
from tinkertrace.spanstore.convert import body_to_table, reference, request_to_table, values
from tinkertrace.spanstore.convert.raw_proto import RawExportTraceServiceRequest
from tinkertrace.spanstore.samples import llm_request

T0 = 1_767_225_600_000_000_000


def _reversed_kv(raw: bytes) -> bytes:
    """The same KeyValue with its fields in the opposite order (valid protobuf, not canonical)."""
    key_len = raw[1]
    return raw[2 + key_len :] + raw[: 2 + key_len]


def test_cached_and_uncached_conversions_agree() -> None:
    """The reference decoder's memo of short attributes and event templates changes nothing."""
    body = llm_request(40, prompt_tokens=50, response_tokens=20, seed=4).SerializeToString()
    values.span_memo.clear()
    values.event_memo.clear()
    cold = reference.convert(body, T0).table
    assert values.span_memo, "short attributes should be cached"
    warm = reference.convert(body, T0).table
    assert cold.equals(warm)


def test_non_canonical_attribute_encoding_decodes_like_canonical() -> None:
    request = llm_request(4, prompt_tokens=100, response_tokens=60, seed=5)
    body = request.SerializeToString()
    raw = RawExportTraceServiceRequest.FromString(body)
    for span in raw.resource_spans[0].scope_spans[0].spans:
        flipped = [_reversed_kv(a) for a in span.attributes]
        del span.attributes[:]
        span.attributes.extend(flipped)
    expected = body_to_table(body, T0).table
    got = body_to_table(raw.SerializeToString(), T0).table
    assert got.equals(expected)
    ids = got.column("prompt_token_ids").to_pylist()[2]
    first = request.resource_spans[0].scope_spans[0].spans[2]
    packed = next(kv.value.bytes_value for kv in first.attributes if kv.key == semconv.PROMPT_TOKEN_IDS)
    assert ids == np.frombuffer(packed, dtype="<i4").tolist()


@pytest.mark.parametrize(
    ("bad", "reason"),
    [(b"\x0a\xff", "malformed attribute"), (b"\x0a\x02\xff\xfe", "malformed attribute")],
)
def test_malformed_attribute_bytes_reject_only_that_span(bad: bytes, reason: str) -> None:
    raw = RawExportTraceServiceRequest.FromString(llm_request(3, seed=6).SerializeToString())
    raw.resource_spans[0].scope_spans[0].spans[1].attributes.append(bad)
    result = body_to_table(raw.SerializeToString(), T0)
    assert (result.accepted, result.rejected) == (2, 1)
    assert "span[1]" in result.errors[0] and reason in result.errors[0]


def test_truncated_body_raises_decode_error() -> None:
    body = llm_request(3, seed=7).SerializeToString()
    with pytest.raises(DecodeError):
        body_to_table(body[: len(body) // 2], T0)


def test_events_json_keeps_attribute_types_and_last_duplicate() -> None:
    request = llm_request(2, seed=8)
    event = request.resource_spans[0].scope_spans[0].spans[0].events.add(name="tool", time_unix_nano=9)
    event.attributes.add(key="n").value.int_value = 1
    event.attributes.add(key="x").value.double_value = 0.5
    event.attributes.add(key="n").value.string_value = "two"
    events = json.loads(request_to_table(request, T0).table.column("events")[0].as_py())
    assert events[1] == {"name": "tool", "time_unix_nano": 9, "attributes": {"n": "two", "x": 0.5}}


@pytest.mark.parametrize("bad_event", [b"\x09\x01", b"\x12\x05ab"])
def test_malformed_event_rejects_only_that_span(bad_event: bytes) -> None:
    raw = RawExportTraceServiceRequest.FromString(llm_request(3, seed=9).SerializeToString())
    raw.resource_spans[0].scope_spans[0].spans[2].events.append(bad_event)
    result = body_to_table(raw.SerializeToString(), T0)
    assert (result.accepted, result.rejected) == (2, 1)
    assert "span[2]" in result.errors[0] and "malformed event" in result.errors[0]


def test_without_numba_body_to_table_uses_the_reference_decoder() -> None:
    """Agents that trace without the collector extra still convert spans (with the Python decoder)."""
    script = (
        "import sys; sys.modules['numba'] = None\n"
        "from tinkertrace.spanstore.convert import body_to_table, compiled_decoder\n"
        "from tinkertrace.spanstore.samples import llm_request\n"
        "assert compiled_decoder() is None\n"
        "result = body_to_table(llm_request(7, prompt_tokens=5, response_tokens=2).SerializeToString(), 1)\n"
        "print(result.accepted, result.table.column('prompt_token_ids').to_pylist()[0][:2])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    accepted, ids = done.stdout.split(" ", 1)
    expected = body_to_table(llm_request(7, prompt_tokens=5, response_tokens=2).SerializeToString(), 1)
    assert int(accepted) == 7
    assert ids.strip() == str(expected.table.column("prompt_token_ids").to_pylist()[0][:2])
