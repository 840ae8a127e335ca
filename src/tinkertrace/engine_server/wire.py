"""The binary half of Tinker's wire format, server side: protobuf in, protobuf out.

The pinned SDK sends ``forward_backward`` bodies as ``tinker_public.ForwardBackwardRequest``
protobuf (optionally zstd-compressed) and accepts ``ForwardBackwardOutput`` and ``SampleResponse``
results only as protobuf. The SDK ships the message classes (``tinker.proto.tinker_public_pb2``) and
the client-side converters (``request_conv``: SDK types → proto, ``response_conv``: proto → SDK
types); this module is their mirror image, so both ends use the same generated messages and the
same ``tinker.types`` objects. Every other body is JSON read and written with ``tinker.types``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from tinker import types
from tinker.proto import tinker_public_pb2 as public_pb
from tinker.types.topk_logprobs import TopkLogprobs

PROTO_CONTENT_TYPE = "application/x-protobuf"

_NUMPY_OF_DTYPE: dict[int, tuple[np.dtype, types.TensorDtype]] = {
    public_pb.DTYPE_FLOAT32: (np.dtype(np.float32), "float32"),
    public_pb.DTYPE_INT64: (np.dtype(np.int64), "int64"),
    public_pb.DTYPE_INT32: (np.dtype(np.int32), "int64"),
}
_STOP_REASON: dict[str, int] = {"stop": public_pb.STOP_REASON_STOP, "length": public_pb.STOP_REASON_LENGTH}


class WireError(ValueError):
    """A request body that cannot be decoded (the client's mistake: HTTP 400)."""


@dataclass
class ForwardBackwardCall:
    """A decoded ``/api/v1/forward_backward`` request."""

    model_id: str
    seq_id: int
    loss_fn: types.LossFnType
    loss_fn_config: dict[str, float | str] | None
    forward_only: bool
    data: list[types.Datum]
    error: WireError | None = None
    """Set when the Datums do not decode: the call must fail, but it still holds its ``seq_id``."""


def decompress(body: bytes, content_encoding: str | None) -> bytes:
    """The body with a ``Content-Encoding: zstd`` undone (the SDK compresses when the server asks)."""
    if not content_encoding or content_encoding == "identity":
        return body
    if content_encoding != "zstd":
        raise WireError(f"unsupported Content-Encoding {content_encoding!r} (only zstd)")
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except zstandard.ZstdError as exc:
        raise WireError(f"corrupt zstd body: {exc}") from None


def _tensor(msg: public_pb.Tensor, where: str) -> types.TensorData:
    if msg.HasField("sparse_csr"):
        raise WireError(f"{where}: sparse tensors are not supported by the local engine")
    if msg.dtype not in _NUMPY_OF_DTYPE:
        raise WireError(f"{where}: unsupported tensor dtype {msg.dtype}")
    np_dtype, dtype = _NUMPY_OF_DTYPE[msg.dtype]
    if len(msg.dense) % np_dtype.itemsize:
        raise WireError(f"{where}: {len(msg.dense)} bytes is not a whole number of {np_dtype} values")
    array = np.frombuffer(msg.dense, dtype=np_dtype)
    shape = list(msg.shape) or [array.size]
    if math.prod(shape) != array.size:
        raise WireError(f"{where}: shape {shape} does not hold {array.size} values")
    return types.TensorData(data=array.reshape(shape), dtype=dtype, shape=shape)


def _chunk(msg: public_pb.Chunk, where: str) -> types.ModelInputChunk:
    kind = msg.WhichOneof("chunk")
    if kind == "encoded_text":
        tokens = msg.encoded_text.tokens
        if len(tokens) % 4:
            raise WireError(f"{where}: token bytes are not int32 values")
        return types.EncodedTextChunk(tokens=np.frombuffer(tokens, dtype=np.int32).tolist())
    if kind == "image":
        image_format = cast(Literal["png", "jpeg"], msg.image.format or "png")  # pydantic checks it
        return types.ImageChunk(data=msg.image.data, format=image_format)
    raise WireError(f"{where}: unsupported model_input chunk {kind!r}")


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """``tinker_public.ForwardBackwardRequest`` bytes → the call, with real ``types.Datum`` objects."""
    msg = public_pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise WireError(f"body is not a ForwardBackwardRequest protobuf: {exc}") from None
    config: dict[str, float | str] | None = None
    if msg.loss_fn_config_v2:
        config = {
            k: (v.text if v.WhichOneof("value") == "text" else v.number)
            for k, v in msg.loss_fn_config_v2.items()
        }
    elif msg.loss_fn_config:
        config = dict(msg.loss_fn_config)
    data, error = [], None
    try:
        for i, datum in enumerate(msg.data):
            chunks = [_chunk(c, f"data[{i}].model_input[{j}]") for j, c in enumerate(datum.model_input)]
            inputs = {
                k: _tensor(t, f"data[{i}].loss_fn_inputs[{k!r}]") for k, t in datum.loss_fn_inputs.items()
            }
            data.append(types.Datum(model_input=types.ModelInput(chunks=chunks), loss_fn_inputs=inputs))
    except WireError as exc:
        error = exc
    return ForwardBackwardCall(
        model_id=msg.model_id,
        seq_id=msg.seq_id,
        loss_fn=cast(types.LossFnType, msg.loss_fn),  # the engine checks it (an unknown one: its error)
        loss_fn_config=config,
        forward_only=msg.forward_only,
        data=data,
        error=error,
    )


def _batched(arrays: list[np.ndarray]) -> public_pb.BatchedTensor:
    """Per-datum 1-D arrays of one dtype → one ``BatchedTensor`` (data + byte offsets)."""
    dtype = arrays[0].dtype if arrays else np.dtype(np.float32)
    proto_dtype = public_pb.DTYPE_INT64 if dtype.kind in "iu" else public_pb.DTYPE_FLOAT32
    np_dtype = np.int64 if proto_dtype == public_pb.DTYPE_INT64 else np.float32
    flat = [np.ascontiguousarray(a.reshape(-1), dtype=np_dtype) for a in arrays]
    offsets = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum([a.nbytes for a in flat], out=offsets[1:])
    data = b"".join(a.tobytes() for a in flat)
    return public_pb.BatchedTensor(data=data, offsets=offsets.tobytes(), dtype=proto_dtype)


def encode_forward_backward_output(output: types.ForwardBackwardOutput) -> bytes:
    """``types.ForwardBackwardOutput`` → ``tinker_public.ForwardBackwardOutput`` bytes (one ArrayRecord)."""
    msg = public_pb.ForwardBackwardOutput(
        loss_fn_output_type=output.loss_fn_output_type,
        metrics={k: float(v) for k, v in output.metrics.items()},
    )
    outputs = output.loss_fn_outputs
    if outputs:
        names = list(outputs[0])
        record = msg.loss_fn_outputs.add(type_tag=output.loss_fn_output_type, num_datums=len(outputs))
        for name in names:
            record.fields[name].CopyFrom(_batched([out[name].to_numpy() for out in outputs]))
    return msg.SerializeToString()


def decode_json_model(model_cls: type[Any], payload: Any) -> Any:
    """Validate a JSON body as ``model_cls`` (a ``tinker.types`` pydantic model)."""
    from pydantic import ValidationError

    try:
        return model_cls.model_validate(payload)
    except ValidationError as exc:
        raise WireError(f"invalid {model_cls.__name__}: {exc}") from None


def encode_sample_response(response: types.SampleResponse) -> bytes:
    """``types.SampleResponse`` → ``tinker_public.SampleResponse`` bytes."""
    msg = public_pb.SampleResponse()
    for seq in response.sequences:
        tokens = seq.tokens_np if seq.tokens_np is not None else np.asarray(seq.tokens)
        out = msg.sequences.add(
            stop_reason=_STOP_REASON[seq.stop_reason],
            tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
        )
        logprobs = seq.logprobs_np if seq.logprobs_np is not None else seq.logprobs
        if logprobs is not None:
            out.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
        if seq.topk_logprobs_np is not None:
            out.topk_sampled_logprobs.CopyFrom(_topk(seq.topk_logprobs_np))
    if response.prompt_logprobs_np is not None:
        msg.prompt_logprobs = np.asarray(response.prompt_logprobs_np, dtype=np.float32).tobytes()
    elif response.prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in response.prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    if response.topk_prompt_logprobs_np is not None:
        msg.topk_prompt_logprobs.CopyFrom(_topk(response.topk_prompt_logprobs_np))
    if response.target_prompt_logprobs is not None:
        msg.target_prompt_logprobs.CopyFrom(_float_tensor(response.target_prompt_logprobs))
    return msg.SerializeToString()


def _topk(topk: TopkLogprobs) -> public_pb.TopkLogprobs:
    ids, values = topk.token_ids, topk.logprobs
    return public_pb.TopkLogprobs(
        token_ids=np.asarray(ids, dtype=np.int32).tobytes(),
        logprobs=np.asarray(values, dtype=np.float32).tobytes(),
        length=int(ids.shape[0]),
        k=int(ids.shape[1]) if ids.ndim == 2 else 0,
    )


def _float_tensor(tensor: types.TensorData) -> public_pb.Tensor:
    """A float32 ``TensorData`` (dense or sparse CSR) as a ``tinker_public.Tensor``."""
    msg = public_pb.Tensor(dtype=public_pb.DTYPE_FLOAT32, shape=list(tensor.shape or []))
    values = np.asarray(
        tensor.to_numpy() if tensor.sparse_crow_indices is None else tensor.data, dtype=np.float32
    )
    if tensor.sparse_crow_indices is None or tensor.sparse_col_indices is None:
        msg.dense = values.tobytes()
    else:
        msg.sparse_csr.values = values.tobytes()
        msg.sparse_csr.crow_indices = np.asarray(tensor.sparse_crow_indices, dtype=np.int64).tobytes()
        msg.sparse_csr.col_indices = np.asarray(tensor.sparse_col_indices, dtype=np.int64).tobytes()
    return msg


def tensor_from_model(model: Any) -> types.TensorData | None:
    """A request's ``TensorData`` JSON model (``tinker.types``' pydantic form) as ``types.TensorData``."""
    if model is None:
        return None
    return types.TensorData(
        data=model.data,
        dtype=model.dtype,
        shape=model.shape,
        sparse_crow_indices=model.sparse_crow_indices,
        sparse_col_indices=model.sparse_col_indices,
    )
