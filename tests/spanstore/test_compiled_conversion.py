"""The compiled decoder (``convert.compiled``) against the reference decoder, on many request shapes.

For every request the fast path either answers exactly what the reference decoder answers (same
table, counts and error messages) or declines (``compiled.Declined``) so that ``body_to_table`` uses
the reference.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tinkertrace import semconv

pytest.importorskip("numba", reason="the compiled converter needs the collector extra (numba)")
from tinkertrace.spanstore.convert import body_to_table, compiled, reference
from tinkertrace.spanstore.samples import llm_request

T0 = 1_767_225_600_000_000_000


def _assert_same(body: bytes, *, fast_expected: bool = True) -> None:
    expected = reference.convert(body, T0)
    try:
        fast = compiled.convert(body, T0)
    except compiled.Declined:
        assert not fast_expected, "the compiled decoder declined a request it should convert"
        return
    assert (fast.accepted, fast.rejected, fast.errors) == (
        expected.accepted,
        expected.rejected,
        expected.errors,
    )
    for name in expected.table.column_names:
        assert fast.table.column(name).equals(expected.table.column(name)), name
    assert fast.table.schema == expected.table.schema


def _kv(key: str, **value: object) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def _mixed_request() -> ExportTraceServiceRequest:
    """Two resources, three scopes; rollout, reward and odd spans with every AnyValue kind."""
    request = llm_request(6, prompt_tokens=30, response_tokens=7, seed=11)
    second = request.resource_spans.add()
    second.resource.attributes.extend([_kv("service.name", string_value="judge"), _kv("pid", int_value=7)])
    for scope_name in ("", "tinkertrace.judge"):
        scope = second.scope_spans.add()
        scope.scope.name = scope_name
        root = scope.spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="rollout ünïcode", kind=1)
        root.start_time_unix_nano, root.end_time_unix_nano = T0, T0 + 5
        root.status.code, root.status.message = 2, "it failed: ✗"
        root.attributes.extend(
            [
                _kv(semconv.SPAN_TYPE, string_value=semconv.TYPE_ROLLOUT),
                _kv(semconv.ROLLOUT_ID, string_value="r-ü"),
                _kv(semconv.ATTEMPT, int_value=-3),
                _kv(semconv.POLICY_VERSION, int_value=2**40),
                _kv(semconv.TASK_INPUT, string_value=json.dumps({"q": 'say "hi"\n', "n": [1, 2]})),
                _kv("flag", bool_value=True),
                _kv("ratio", double_value=-0.125),
                _kv("blob", bytes_value=b"\x00\xff"),
                _kv("list", array_value={"values": [AnyValue(int_value=1), AnyValue(string_value="x")]}),
                _kv("map", kvlist_value={"values": [_kv("a", double_value=1.5)]}),
                _kv("empty"),
                _kv("", string_value="no key"),
            ]
        )
        reward = scope.spans.add(trace_id=b"\x01" * 16, span_id=b"\x03" * 8, parent_span_id=b"\x02" * 8)
        reward.name = semconv.REWARD_SPAN_NAME
        reward.attributes.extend(
            [
                _kv(semconv.REWARD_VALUE, double_value=0.75),
                _kv(semconv.REWARD_NAME, string_value="primary"),
                _kv(semconv.SPAN_TYPE, string_value=semconv.TYPE_REWARD),
            ]
        )
        reward.events.add(name="a", time_unix_nano=1).attributes.extend([_kv("k", string_value="v")])
        reward.events.add(name="b", time_unix_nano=2**62)
        int_reward = scope.spans.add(trace_id=b"\x01" * 16, span_id=b"\x04" * 8)
        int_reward.attributes.append(_kv(semconv.REWARD_VALUE, int_value=3))
    return request


def test_llm_spans_from_the_sample_exporter_take_the_fast_path() -> None:
    _assert_same(llm_request(512, seed=3).SerializeToString())


def test_mixed_resources_scopes_and_attribute_kinds_match_the_reference() -> None:
    _assert_same(_mixed_request().SerializeToString())


def test_integer_attributes_of_every_size_match_the_reference() -> None:
    """Integers not lifted into columns (token counts) get their digits from the join kernel: every
    width and sign, the int64 extremes, another value on every span, keys that need escaping."""
    request = llm_request(12, prompt_tokens=4, response_tokens=2, seed=18)
    values = [0, 7, -1, 9, 10, -10, 99, 100, 12345, -987654321, 2**63 - 1, -(2**63)]
    for span, value in zip(request.resource_spans[0].scope_spans[0].spans, values, strict=True):
        span.attributes.extend(
            [
                _kv("count", int_value=value),
                _kv("ratio", double_value=0.5),
                _kv('ünï "q"', int_value=-(value // 3)),
            ]
        )
    _assert_same(request.SerializeToString())


def test_an_integer_attribute_with_a_key_that_is_not_utf8_is_left_to_the_reference_decoder() -> None:
    request = llm_request(2, prompt_tokens=4, response_tokens=2, seed=19)
    request.resource_spans[0].scope_spans[0].spans[1].attributes.append(_kv("KEYX", int_value=5))
    body = request.SerializeToString().replace(b"KEYX", b"\xff\xfeKX")
    with pytest.raises(compiled.Declined):
        compiled.convert(body, T0)
    result = body_to_table(body, T0)  # the reference rejects that span alone
    assert (result.accepted, result.rejected) == (1, 1)
    assert "malformed attribute" in result.errors[0] and "bad UTF-8" in result.errors[0]


@pytest.mark.parametrize("where", ["name", "status message", "lifted attribute"])
def test_strings_that_are_not_utf8_are_left_to_the_reference_decoder(where: str) -> None:
    """Every gathered string column is checked (in one call): a bad value in any of them declines."""
    request = llm_request(4, prompt_tokens=4, response_tokens=2, seed=20)
    span = request.resource_spans[0].scope_spans[0].spans[2]
    if where == "name":
        span.name = "QQQQ"
    elif where == "status message":
        span.status.message = "QQQQ"
    else:
        span.attributes.append(_kv(semconv.REWARD_NAME, string_value="QQQQ"))
    body = request.SerializeToString().replace(b"QQQQ", b"Q\xc3\x28Q")
    with pytest.raises(compiled.Declined):
        compiled.convert(body, T0)
    if where == "lifted attribute":  # the reference rejects that span alone
        result = body_to_table(body, T0)
        assert (result.accepted, result.rejected) == (3, 1) and "bad UTF-8" in result.errors[0]
    else:  # a bad span field makes the whole request malformed (400)
        with pytest.raises(DecodeError, match="bad UTF-8"):
            body_to_table(body, T0)


def test_empty_requests_match_the_reference() -> None:
    _assert_same(b"")
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add()
    _assert_same(request.SerializeToString())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("trace_id", b"\x01" * 15),
        ("trace_id", bytes(16)),
        ("span_id", bytes(8)),
        ("span_id", b""),
        ("parent_span_id", b"\x01" * 3),
    ],
)
def test_rejected_ids_give_the_reference_counts_and_messages(field: str, value: bytes) -> None:
    request = llm_request(5, prompt_tokens=10, response_tokens=3, seed=12)
    setattr(request.resource_spans[0].scope_spans[0].spans[3], field, value)
    _assert_same(request.SerializeToString())


def test_every_span_rejected_gives_an_empty_table() -> None:
    request = llm_request(3, prompt_tokens=4, response_tokens=2, seed=13)
    for span in request.resource_spans[0].scope_spans[0].spans:
        span.trace_id = b""
    _assert_same(request.SerializeToString())


def test_missing_token_attributes_are_null_lists() -> None:
    request = llm_request(4, prompt_tokens=5, response_tokens=2, seed=14)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    kept = [kv for kv in span.attributes if kv.key != semconv.RESPONSE_LOGPROBS]
    del span.attributes[:]
    span.attributes.extend(kept)
    _assert_same(request.SerializeToString())
    table = body_to_table(request.SerializeToString(), T0).table
    assert table.column("response_logprobs").null_count == 1


@pytest.mark.parametrize(
    "change",
    [
        "double_in_id_array",
        "id_beyond_int32",
        "int_in_logprob_array",
        "string_in_array",
        "repeated_key",
        "link",
        "int_rollout_id",
        "odd_packed_length",
        "event_without_time",
    ],
)
def test_shapes_the_fast_path_declines_still_convert_exactly(change: str) -> None:
    request = llm_request(3, prompt_tokens=6, response_tokens=2, packed="array" not in change, seed=15)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    if change in ("double_in_id_array", "id_beyond_int32", "int_in_logprob_array", "string_in_array"):
        key, element = {
            "double_in_id_array": (semconv.PROMPT_TOKEN_IDS, AnyValue(double_value=2.0)),
            "id_beyond_int32": (semconv.RESPONSE_TOKEN_IDS, AnyValue(int_value=2**31)),
            "int_in_logprob_array": (semconv.RESPONSE_LOGPROBS, AnyValue(int_value=0)),
            "string_in_array": (semconv.PROMPT_TOKEN_IDS, AnyValue(string_value="7")),
        }[change]
        next(kv for kv in span.attributes if kv.key == key).value.array_value.values.append(element)
    elif change == "repeated_key":
        span.attributes.extend([_kv("x", int_value=1), _kv("x", string_value="two")])
    elif change == "link":
        span.links.add(trace_id=b"\x05" * 16, span_id=b"\x06" * 8)
    elif change == "int_rollout_id":
        span.attributes.append(_kv(semconv.ROLLOUT_ID, int_value=9))
    elif change == "odd_packed_length":
        span.attributes.append(_kv(semconv.PROMPT_TOKEN_IDS, bytes_value=b"\x01\x02\x03"))
    elif change == "event_without_time":
        span.events.add(name="zero time")
    body = request.SerializeToString()
    with pytest.raises(compiled.Declined):
        compiled.convert(body, T0)
    assert body_to_table(body, T0).table.equals(reference.convert(body, T0).table)


def test_plain_otel_arrays_of_token_ids_and_logprobs_take_the_fast_path() -> None:
    """Other producers' form (Agent-lightning, the plain OTel SDK): int arrays of token ids and double
    arrays of logprobs, alone or mixed with packed spans, negative and extreme ids, empty arrays."""
    arrays = llm_request(6, prompt_tokens=40, response_tokens=9, packed=False, spread=0.5, seed=30)
    _assert_same(arrays.SerializeToString())
    spans = arrays.resource_spans[0].scope_spans[0].spans
    ids = next(kv for kv in spans[2].attributes if kv.key == semconv.PROMPT_TOKEN_IDS)
    ids.value.array_value.values[0].int_value = -(2**31)
    ids.value.array_value.values[1].int_value = 2**31 - 1
    ids.value.array_value.values[2].int_value = -1
    del next(
        kv for kv in spans[3].attributes if kv.key == semconv.RESPONSE_LOGPROBS
    ).value.array_value.values[:]
    packed = llm_request(4, prompt_tokens=20, response_tokens=5, seed=31)
    spans.extend(packed.resource_spans[0].scope_spans[0].spans)  # packed and array rows in one column
    _assert_same(arrays.SerializeToString())
    row = compiled.convert(arrays.SerializeToString(), T0).table.slice(2, 1).to_pylist()[0]
    assert row["prompt_token_ids"][:3] == [-(2**31), 2**31 - 1, -1]


def _as_agentlightning(request: ExportTraceServiceRequest) -> None:
    """Rename our token id attributes to Agent-lightning's keys (int lists), in place."""
    renames = {semconv.PROMPT_TOKEN_IDS: semconv.AGL_PROMPT_TOKEN_IDS}
    renames[semconv.RESPONSE_TOKEN_IDS] = semconv.AGL_RESPONSE_TOKEN_IDS
    for span in request.resource_spans[0].scope_spans[0].spans:
        for kv in span.attributes:
            kv.key = renames.get(kv.key, kv.key)


def test_agentlightning_token_id_lists_fill_the_token_columns_on_the_fast_path() -> None:
    request = llm_request(5, prompt_tokens=30, response_tokens=6, packed=False, seed=32)
    ours = reference.convert(request.SerializeToString(), T0).table
    _as_agentlightning(request)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[1].attributes.append(_kv(semconv.PROMPT_TOKEN_IDS, bytes_value=b"\x07\x00\x00\x00"))  # ours win
    _assert_same(request.SerializeToString())
    table = compiled.convert(request.SerializeToString(), T0).table
    assert table.column("prompt_token_ids")[1].as_py() == [7]
    for column in ("response_token_ids", "response_logprobs"):
        assert table.column(column).equals(ours.column(column))
    assert table.column("prompt_token_ids")[0].as_py() == ours.column("prompt_token_ids")[0].as_py()
    assert "token_ids" not in table.column("attributes")[0].as_py()


def test_an_agentlightning_key_that_holds_no_token_ids_stays_an_attribute() -> None:
    request = llm_request(2, prompt_tokens=4, response_tokens=2, seed=33)
    request.resource_spans[0].scope_spans[0].spans[0].attributes.append(
        _kv(semconv.AGL_PROMPT_TOKEN_IDS, string_value="not a list")
    )
    body = request.SerializeToString()
    with pytest.raises(compiled.Declined):
        compiled.convert(body, T0)
    table = body_to_table(body, T0).table
    assert json.loads(table.column("attributes")[0].as_py())[semconv.AGL_PROMPT_TOKEN_IDS] == "not a list"
    assert table.column("prompt_token_ids")[0].as_py() is not None


def test_token_values_survive_exactly() -> None:
    request = llm_request(8, prompt_tokens=33, response_tokens=9, seed=16)
    table = compiled.convert(request.SerializeToString(), T0).table
    span = request.resource_spans[0].scope_spans[0].spans[5]
    packed = {kv.key: kv.value.bytes_value for kv in span.attributes if kv.value.HasField("bytes_value")}
    row = table.slice(5, 1).to_pylist()[0]
    assert row["prompt_token_ids"] == np.frombuffer(packed[semconv.PROMPT_TOKEN_IDS], "<i4").tolist()
    expected = np.frombuffer(packed[semconv.RESPONSE_LOGPROBS], "<f4")
    assert np.array_equal(np.array(row["response_logprobs"], dtype=np.float32), expected)
    assert row["trace_id"] == span.trace_id.hex() and row["span_id"] == span.span_id.hex()


def test_random_corruptions_never_disagree_with_the_reference() -> None:
    """Flip bytes of a valid request: the fast path must agree, decline, or the body is invalid."""
    body = bytearray(_mixed_request().SerializeToString())
    rng = np.random.default_rng(0)
    for _ in range(300):
        corrupted = bytearray(body)
        for position in rng.integers(0, len(body), size=3):
            corrupted[position] = int(rng.integers(0, 256))
        try:
            reference.convert(bytes(corrupted), T0)
        except Exception:  # the reference rejects the whole body: the fast path must not accept it
            with pytest.raises(compiled.Declined):
                compiled.convert(bytes(corrupted), T0)
            continue
        _assert_same(bytes(corrupted), fast_expected=False)


def test_out_of_range_attempt_is_kept_as_an_attribute_not_an_error() -> None:
    request = llm_request(3, prompt_tokens=4, response_tokens=2, seed=17)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    kept = [kv for kv in span.attributes if kv.key != semconv.ATTEMPT]
    del span.attributes[:]
    span.attributes.extend([*kept, _kv(semconv.ATTEMPT, int_value=2**40)])
    body = request.SerializeToString()
    result = body_to_table(body, T0)
    assert (result.accepted, result.rejected) == (3, 0)
    row = result.table.slice(0, 1).to_pylist()[0]
    assert row["attempt"] is None
    assert json.loads(row["attributes"])[semconv.ATTEMPT] == 2**40
    assert result.table.column("attempt").to_pylist()[1:] == [0, 0]


def test_tables_do_not_change_when_the_next_request_is_converted() -> None:
    """The scan's scratch matrices are reused per thread: no column may keep a view of them."""
    first = compiled.convert(llm_request(1, seed=1).SerializeToString(), T0)
    snapshot = first.table.to_pylist()
    for n in (1, 2, 7):
        compiled.convert(llm_request(n, seed=100 + n).SerializeToString(), T0 + n)
    assert first.table.to_pylist() == snapshot


def test_the_dispatcher_says_which_decoder_converted_a_request() -> None:
    result = body_to_table(llm_request(4, seed=5).SerializeToString(), T0)
    assert (result.decoder, result.fallback, result.accepted) == ("compiled", None, 4)


def test_a_request_the_compiled_decoder_declines_is_converted_by_the_reference_and_the_reason_given() -> None:
    request = llm_request(3, prompt_tokens=4, response_tokens=2, seed=6)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    span.links.add(trace_id=span.trace_id, span_id=span.span_id)  # links: outside the scanned subset
    body = request.SerializeToString()
    result = body_to_table(body, T0)
    assert (result.decoder, result.fallback) == ("reference", compiled.SCAN_DECLINED)
    assert result.table.equals(reference.convert(body, T0).table)
    assert json.loads(result.table.column("links")[1].as_py())[0]["span_id"] == span.span_id.hex()


def test_an_error_inside_the_compiled_decoder_falls_back_by_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(compiled, "_check_ids", broken)
    body = llm_request(2, seed=7).SerializeToString()
    result = body_to_table(body, T0)
    assert (result.decoder, result.fallback, result.accepted) == ("reference", "ValueError", 2)
