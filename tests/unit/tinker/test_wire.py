"""The protobuf bodies against the SDK's own converters: a request the SDK encodes parses here, and what this
server encodes the SDK decodes."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.tinker.errors import TinkerUserError
from agentrl.tinker.wire import WireSequence, forward_backward_output, parse_forward_backward, sample_response

tinker = pytest.importorskip("tinker")


def test_a_request_the_sdk_encodes_parses_with_its_tensors_and_config() -> None:
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5]),
                        loss_fn_inputs={"target_tokens": np.array([4, 5, 6]), "advantages": np.array([0.5, 0, -1.0]),
                                        "logprobs": np.array([-1.0, -2.0, -3.0], dtype=np.float32)})
    req = types.ForwardBackwardRequest(model_id="s:train:0", seq_id=7, forward_backward_input=types.ForwardBackwardInput(
        data=[datum], loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7}))
    msg = forward_backward_request_to_proto(req)
    msg.forward_only = True
    got = parse_forward_backward(msg.SerializeToString())
    assert (got.model_id, got.seq_id, got.loss_fn, got.forward_only) == ("s:train:0", 7, "ppo", True)
    assert got.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7)}
    d = got.data[0]
    assert d.tokens.tolist() == [3, 4, 5] and d.inputs["target_tokens"].tolist() == [4, 5, 6]
    assert d.inputs["advantages"].tolist() == [0.5, 0, -1.0] and d.inputs["logprobs"].dtype == np.float32


def test_a_body_that_is_not_the_protobuf_is_a_user_error() -> None:
    with pytest.raises(TinkerUserError, match="not a ForwardBackwardRequest"):
        parse_forward_backward(b"\x00\xff\xff garbage")


def test_the_sdk_decodes_our_forward_backward_output() -> None:
    from tinker.proto.response_conv import deserialize_forward_backward_output

    outs = [{"logprobs": np.array([-1.0, -2.0], dtype=np.float32)}, {"logprobs": np.array([-0.5], dtype=np.float32)}]
    got = deserialize_forward_backward_output(forward_backward_output(outs, {"loss:sum": 3.5}))
    assert got.metrics == {"loss:sum": 3.5} and len(got.loss_fn_outputs) == 2
    assert got.loss_fn_outputs[0]["logprobs"].tolist() == [-1.0, -2.0]
    assert got.loss_fn_outputs[1]["logprobs"].tolist() == [-0.5]


def test_the_sdk_decodes_our_sample_response() -> None:
    from tinker.proto.response_conv import deserialize_sample_response

    body = sample_response([WireSequence([7, 8], [-0.1, -0.2], "stop"), WireSequence([9], [-0.3], "length")],
                           prompt_logprobs=[None, -1.5], topk_prompt=[None, [(4, -0.2), (5, -1.5)]])
    got = deserialize_sample_response(body)
    assert [s.tokens for s in got.sequences] == [[7, 8], [9]]
    assert [s.stop_reason for s in got.sequences] == ["stop", "length"]
    assert got.sequences[0].logprobs == pytest.approx([-0.1, -0.2])
    assert got.prompt_logprobs[0] is None and got.prompt_logprobs[1] == pytest.approx(-1.5)
