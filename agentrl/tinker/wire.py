"""The protobuf bodies of the wire protocol (the SDK's compiled ``tinker.proto.tinker_public_pb2``; no
``.proto`` file ships): a forward/backward request in, forward/backward and sampling results out. Tokens
travel as int32 bytes, tensors as dense or CSR bytes with a dtype and a shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.tinker.errors import TinkerUserError


def _pb() -> Any:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


_NUMPY = {"DTYPE_FLOAT32": np.float32, "DTYPE_INT64": np.int64, "DTYPE_INT32": np.int32}


@dataclass
class WireDatum:
    """One datum of a forward/backward request: its input tokens and its loss inputs as arrays."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class FwdBwdRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def _tensor(msg: Any, name: str) -> np.ndarray:
    pb = _pb()
    dtype = _NUMPY.get(pb.DType.Name(msg.dtype))
    if dtype is None:
        raise TinkerUserError(f"loss_fn_inputs[{name!r}]: dtype {pb.DType.Name(msg.dtype)} is not float32 or int64")
    shape = list(msg.shape)
    if msg.WhichOneof("encoding") == "sparse_csr":
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(csr.col_indices, dtype=np.int64)
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
            raise TinkerUserError(f"loss_fn_inputs[{name!r}]: a sparse tensor that is not a 2-D CSR of its shape")
        dense = np.zeros(shape, dtype=dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(crow))
        dense[rows, col] = values
        return dense
    arr = np.frombuffer(msg.dense, dtype=dtype)
    if shape and int(np.prod(shape)) != arr.size:
        raise TinkerUserError(f"loss_fn_inputs[{name!r}]: {arr.size} values for shape {shape}")
    return arr.reshape(shape) if shape else arr


def _tokens(datum: Any, i: int) -> np.ndarray:
    parts = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise TinkerUserError(f"datum {i}: a {kind or 'empty'} chunk; this server trains on token chunks "
                                  "(EncodedTextChunk) only")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    tokens = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    if tokens.size == 0:
        raise TinkerUserError(f"datum {i}: model_input has no tokens")
    return tokens


def parse_forward_backward(body: bytes) -> FwdBwdRequest:
    """Decode a ``ForwardBackwardRequest`` body; :class:`TinkerUserError` for one that does not parse."""
    from google.protobuf.message import DecodeError

    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as e:
        raise TinkerUserError(f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({e})") from e
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = [WireDatum(_tokens(d, i), {name: _tensor(t, name) for name, t in d.loss_fn_inputs.items()})
            for i, d in enumerate(msg.data)]
    if not msg.model_id:
        raise TinkerUserError("forward_backward: model_id is missing")
    return FwdBwdRequest(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput`` body: one ArrayRecord whose fields hold every datum's arrays back to back
    (byte offsets per datum), and the metrics."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add()
    record.type_tag = "ArrayRecord"
    record.num_datums = len(outputs)
    for name in (outputs[0].keys() if outputs else ()):
        arrays = [np.ascontiguousarray(o[name], dtype=np.float32) for o in outputs]
        sizes = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        bt = record.fields[name]
        bt.data = b"".join(a.tobytes() for a in arrays)
        bt.offsets = sizes.tobytes()
        bt.dtype = pb.DTYPE_FLOAT32
        bt.trailing_shape.extend(list(arrays[0].shape[1:]) if arrays else [])
    return msg.SerializeToString()


@dataclass
class WireSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    """``stop`` or ``length``."""


def sample_response(sequences: list[WireSequence], prompt_logprobs: list[float | None] | None = None,
                    topk_prompt: list[list[tuple[int, float]] | None] | None = None) -> bytes:
    """A ``SampleResponse`` body; a missing prompt logprob (the first token's) travels as NaN."""
    pb = _pb()
    msg = pb.SampleResponse()
    for seq in sequences:
        s = msg.sequences.add()
        s.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        s.tokens = np.asarray(seq.tokens, dtype=np.int32).tobytes()
        s.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray([np.nan if v is None else v for v in prompt_logprobs],
                                         dtype=np.float32).tobytes()
    if topk_prompt:
        k = max((len(row) for row in topk_prompt if row), default=0)
        if k:
            ids = np.zeros((len(topk_prompt), k), dtype=np.int32)
            lps = np.full((len(topk_prompt), k), -np.inf, dtype=np.float32)
            for i, row in enumerate(topk_prompt):
                for j, (tok, lp) in enumerate((row or [])[:k]):
                    ids[i, j], lps[i, j] = tok, lp
            msg.topk_prompt_logprobs.token_ids = ids.tobytes()
            msg.topk_prompt_logprobs.logprobs = lps.tobytes()
            msg.topk_prompt_logprobs.k = k
            msg.topk_prompt_logprobs.length = len(topk_prompt)
    return msg.SerializeToString()
