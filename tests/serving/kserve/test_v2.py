"""The v2 rules of the KServe adapter, without a server (``handlerkit.serving.kserve._v2``);
tests/serving/kserve/test_kserve.py and tests/serving/test_v2_check_kserve_adapter.py run them on a live one."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from handlerkit.serving._http import Reply, worker_error
from handlerkit.serving._http import error_reply as ts_error
from handlerkit.serving.kserve._v2 import error_reply, input_problems, invalid_request, request_validation_response


def _input(**overrides):
    return {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3, 4.5], **overrides}


@pytest.mark.parametrize(
    "tensor",
    [
        _input(),
        _input(data=[[1.0, 2.0], [3.0, 4.0]]),  # nested, as the spec allows
        _input(datatype="INT64", data=[1, 2, 3, 4]),
        _input(datatype="BOOL", data=[True, False, True, True]),
        _input(datatype="BYTES", shape=[1], data=["aGVsbG8="]),
        _input(shape=[0], data=[]),
    ],
)
def test_well_formed_inputs_break_nothing(tensor):
    assert input_problems([tensor]) == []


@pytest.mark.parametrize(
    "tensor, problem",
    [
        (_input(shape=[2, 3]), "input 'x' shape [2, 3] holds 6 elements, its data 4"),
        (_input(data=[[1.0, 2.0], [3.0]]), "input 'x' shape [2, 2] holds 4 elements, its data 3"),
        (_input(shape=[2, -2]), "input 'x' shape [2, -2] is not a list of integers >= 0"),
        (_input(shape=[2.0, 2]), "input 'x' shape [2.0, 2] is not a list of integers >= 0"),
        (_input(shape="2x2"), "input 'x' shape '2x2' is not a list of integers >= 0"),
        (_input(datatype="FLOAT"), "input 'x' datatype 'FLOAT' is none of BOOL, UINT8"),
        (_input(data=["a", "b", "c", "d"]), "input 'x' is FP32: its data must be numbers, got 'a'"),
        (_input(data=[1.0, True, 2.0, 3.0]), "input 'x' is FP32: its data must be numbers, got True"),
        (_input(datatype="INT32", data=[1, 2, 3, 4.5]), "input 'x' is INT32: its data must be integers, got 4.5"),
        (_input(datatype="BOOL", data=[1, 0, 1, 0]), "input 'x' is BOOL: its data must be booleans, got 1"),
        (_input(datatype="BYTES", shape=[1], data=[0.5]), "input 'x' is BYTES: its data must be strings, got 0.5"),
        (_input(name=None), "inputs[1] has no string name: got None"),
        ({"name": "x", "shape": [1], "datatype": "FP32"}, "input 'x' has no data"),
        ("x", "inputs[1] is str, not an object"),
    ],
)
def test_each_broken_rule_is_named_with_its_input(tensor, problem):
    problems = input_problems([_input(name="ok"), tensor])
    assert len(problems) == 1 and problems[0].startswith(problem), problems  # the second input's alone


def test_no_inputs_and_several_problems_together():
    assert input_problems([]) == ["expected a non-empty list of input tensors under 'inputs': got []"]
    assert input_problems(None) == ["expected a non-empty list of input tensors under 'inputs': got None"]
    both = input_problems([_input(shape=[3], data=["a", "b", "c"]), _input(name="y", datatype="X")])
    assert both == ["input 'x' is FP32: its data must be numbers, got 'a'", "input 'y' datatype 'X' is none of "
                    "BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES"]  # fmt: skip


def test_inputs_are_checked_against_the_declared_ones_where_the_metadata_has_some():
    declared = [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}, {"name": "mask", "datatype": "BOOL", "shape": [-1]}]
    assert input_problems([_input()], declared) == []
    assert input_problems([_input(datatype="FP64")], declared) == ["input 'x' is FP64; the model declares it FP32"]
    assert input_problems([_input(name="pixels")], declared) == ["input 'pixels' is not one of the model's inputs (x, mask)"]


def _error(reply: Reply) -> tuple[int, str]:
    assert reply.headers == {"content-type": "application/json"}
    return reply.status, json.loads(reply.body)["error"]


def test_an_invalid_request_is_a_400_with_every_problem_and_the_fix():
    status, message = _error(invalid_request(["input 'x' has no data", "input 'y' has no data"]))
    assert status == 400
    assert message.startswith("invalid v2 inference request: input 'x' has no data; input 'y' has no data. Fix: send each input as {")


def test_v2_errors_keep_the_status_and_torchserves_message():
    assert _error(error_reply(worker_error(503, "Prediction failed"))) == (503, "Prediction failed")
    assert _error(error_reply(ts_error(404, "Model not found"))) == (404, "Model not found")
    # A handler's own status for one request: the error of its output item.
    answered = {"id": "a", "outputs": [{"name": "img", "shape": [1], "datatype": "BYTES",
                                        "data": [{"code": 400, "error": "not an image"}]}]}  # fmt: skip
    assert _error(error_reply(Reply(400, "Bad Request", {}, json.dumps(answered).encode()))) == (400, "not an image")
    assert _error(error_reply(Reply(422, "no values", {}, b"plain text"))) == (422, "no values: plain text")
    assert _error(error_reply(Reply(500, None, {}, b"x" * 3000))) == (500, "x" * 2000 + "…")


def test_fastapis_validation_errors_are_a_400_error_on_v2_routes_only():
    from fastapi.exceptions import RequestValidationError

    errors = [
        {"type": "missing", "loc": ("body", "InferenceRequest", "inputs"), "msg": "Field required"},
        {"type": "bytes_type", "loc": ("body", "bytes"), "msg": "Input should be a valid bytes"},
    ]
    exc = RequestValidationError(errors)
    v2 = SimpleNamespace(url=SimpleNamespace(path="/v2/models/m/infer"))
    response = asyncio.run(request_validation_response(v2, exc))
    assert response.status_code == 400 and json.loads(response.body) == {
        "error": "expected a v2 inference request, a JSON object with 'inputs': inputs: Field required. "
        'Fix: send {"inputs": [{"name": "input-0", "shape": [1, 3], "datatype": "FP32", "data": [0.5, 1.0, 1.5]}]}'
    }
    bad_json = RequestValidationError([{"type": "json_invalid", "loc": ("body", 21), "msg": "JSON decode error"}])
    response = asyncio.run(request_validation_response(v2, bad_json))
    assert "'inputs': malformed JSON at character 21. Fix:" in json.loads(response.body)["error"]
    other = SimpleNamespace(url=SimpleNamespace(path="/openai/v1/completions"))
    response = asyncio.run(request_validation_response(other, exc))
    assert response.status_code == 422 and json.loads(response.body)["detail"][0]["msg"] == "Field required"
