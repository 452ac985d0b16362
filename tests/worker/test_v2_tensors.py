"""The Open Inference Protocol v2 tensor rule (``handlerkit.worker.v2_tensors``), the one the kservev2
envelope, model-config.yaml's ``v2:``, the KServe server and the v2 check all ask."""

from __future__ import annotations

import numpy as np
import pytest

from handlerkit._validate import is_int
from handlerkit.worker.v2_tensors import (
    DATATYPES,
    DTYPE_DATATYPES,
    element_kind,
    error_body,
    flat,
    input_problems,
    invalid_request_message,
    metadata_problems,
    nest,
    tensor_problems,
)

# One element of each datatype, and one that is not of it.
GOOD = {"BOOL": True, "BYTES": "aGVsbG8=", **{t: 7 for t in DATATYPES if "INT" in t}, **{t: 0.5 for t in DATATYPES if t.startswith("FP")}}
BAD = {"BOOL": 1, "BYTES": 0.5, **{t: 7.5 for t in DATATYPES if "INT" in t}, **{t: "0.5" for t in DATATYPES if t.startswith("FP")}}
WORDS = {"BOOL": "booleans", "BYTES": "strings", **{t: "integers" for t in DATATYPES if "INT" in t}, **{t: "numbers" for t in DATATYPES if t.startswith("FP")}}


def _input(**overrides):
    return {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3, 4.5], **overrides}


def test_the_table_is_the_specs():
    assert DATATYPES == ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                         "FP16", "FP32", "FP64", "BYTES")  # fmt: skip
    assert set(GOOD) == set(BAD) == set(WORDS) == set(DATATYPES)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_each_datatype_takes_its_elements_and_refuses_others(datatype):
    good = {"name": "t", "shape": [3], "datatype": datatype, "data": [GOOD[datatype]] * 3}
    assert tensor_problems(good, "input 't'") == []
    bad = {**good, "data": [GOOD[datatype], BAD[datatype], GOOD[datatype]]}
    assert tensor_problems(bad, "input 't'") == [
        f"input 't' is {datatype}: its data must be {WORDS[datatype]}, got {BAD[datatype]!r}"
    ]
    assert element_kind(datatype)[0] == WORDS[datatype]


def test_a_bool_is_no_integer_nor_number():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert tensor_problems(_input(datatype="INT8", data=[1, 2, 3, False]), "x") == [
        "x is INT8: its data must be integers, got False"
    ]
    assert tensor_problems(_input(data=[1.0, True, 2.0, 3.0]), "x") == ["x is FP32: its data must be numbers, got True"]


@pytest.mark.parametrize(
    "tensor, problem",
    [
        (_input(shape=[2, 3]), "x shape [2, 3] holds 6 elements, its data 4"),
        (_input(data=[[1.0, 2.0], [3.0]]), "x shape [2, 2] holds 4 elements, its data 3"),
        (_input(shape=[2, -1]), "x shape [2, -1] is not a list of integers >= 0"),
        (_input(shape=[2.0, 2]), "x shape [2.0, 2] is not a list of integers >= 0"),
        (_input(shape=[True, 2]), "x shape [True, 2] is not a list of integers >= 0"),
        (_input(shape="2x2"), "x shape '2x2' is not a list of integers >= 0"),
        (_input(datatype="FLOAT"), "x datatype 'FLOAT' is none of BOOL, UINT8, UINT16"),
        (_input(name=None), "x has no string name: got None"),
        ({"name": "x", "shape": [1], "datatype": "FP32"}, "x has no data"),
        ("x", "x is str, not an object"),
    ],
)
def test_each_broken_rule_is_named(tensor, problem):
    problems = tensor_problems(tensor, "x")
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_request_dimension_is_concrete_a_declared_one_may_be_minus_one():
    declared = {"name": "x", "datatype": "FP32", "shape": [-1, 3]}
    assert tensor_problems(declared, "inputs[0]", declared=True) == []  # no data needed either
    assert tensor_problems({**declared, "shape": [-2, 3]}, "inputs[0]", declared=True) == [
        "inputs[0] shape [-2, 3] is not a list of integers >= -1"
    ]
    sent = {**declared, "data": [0.5] * 3}
    assert tensor_problems(sent, "input 'x'") == ["input 'x' shape [-1, 3] is not a list of integers >= 0"]
    assert input_problems([{**sent, "shape": [1, 3]}], [declared]) == []
    assert input_problems([{**sent, "shape": [4, 3], "data": [0.5] * 12}], [declared]) == []
    assert input_problems([{**sent, "shape": [1, 2], "data": [0.5] * 2}], [declared]) == [
        "input 'x' has shape [1, 2]; the model declares [-1, 3] (-1: any size)"
    ]
    assert input_problems([{**sent, "shape": [3], "data": [0.5] * 3}], [declared]) == [
        "input 'x' has shape [3]; the model declares [-1, 3] (-1: any size)"
    ]


def test_nested_and_flat_data_are_the_same_tensor():
    values = list(range(24))
    nested = nest(values, [2, 3, 4])
    assert nested[1][2] == [20, 21, 22, 23] and flat(nested) == values
    assert nest(values, [24]) == values and nest([], [0, 3]) == []
    flat_input = {"name": "x", "shape": [2, 3, 4], "datatype": "INT64", "data": values}
    assert tensor_problems(flat_input, "x") == tensor_problems({**flat_input, "data": nested}, "x") == []
    assert flat(5) == [5]  # a scalar is one element
    assert tensor_problems({**flat_input, "shape": [], "data": 5}, "x") == []  # a scalar tensor


def test_elements_false_counts_but_does_not_type_the_data():
    answered = {"name": "y", "shape": [1], "datatype": "BYTES", "data": [{"circle": 0.9}]}  # kservev2's dict output
    assert tensor_problems(answered, "outputs[0]", elements=False) == []
    assert tensor_problems(answered, "outputs[0]") == ["outputs[0] is BYTES: its data must be strings, got {'circle': 0.9}"]


def test_a_requests_inputs_each_named_and_checked_against_the_declared_ones():
    assert input_problems([]) == ["expected a non-empty list of input tensors under 'inputs': got []"]
    assert input_problems(None) == ["expected a non-empty list of input tensors under 'inputs': got None"]
    both = input_problems([_input(shape=[3], data=["a", "b", "c"]), _input(name="y", datatype="X"), "z"])
    assert both == [
        "input 'x' is FP32: its data must be numbers, got 'a'",
        "input 'y' datatype 'X' is none of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, "
        "FP32, FP64, BYTES",
        "inputs[2] is str, not an object",
    ]
    declared = [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}, {"name": "mask", "datatype": "BOOL", "shape": [-1]}]
    assert input_problems([_input()], declared) == []
    assert input_problems([_input(datatype="FP64")], declared) == ["input 'x' is FP64; the model declares it FP32"]
    assert input_problems([_input(name="pixels")], declared) == ["input 'pixels' is not one of the model's inputs (x, mask)"]


def test_metadata_problems_name_the_list_and_each_tensor():
    assert metadata_problems([{"name": "a", "datatype": "BYTES", "shape": [-1]}], "inputs") == []
    assert metadata_problems({"name": "a"}, "v2.inputs") == ["v2.inputs is dict, not a list of tensors"]
    twice = [{"name": "a", "datatype": "BYTES", "shape": [-1]}, {"name": "a", "datatype": "FP32", "shape": [1]}]
    assert metadata_problems(twice, "outputs") == ["outputs names 'a' more than once"]
    assert metadata_problems([{"name": "a", "datatype": "fp32", "shape": -1}], "inputs") == [
        "inputs[0] datatype 'fp32' is none of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, "
        "FP32, FP64, BYTES",
        "inputs[0] shape -1 is not a list of integers >= -1",
    ]


def test_the_error_body_and_the_invalid_request_message():
    assert error_body("no such model") == {"error": "no such model"}
    assert invalid_request_message(["input 'x' has no data", "input 'y' has no data"]) == (
        "invalid v2 inference request: input 'x' has no data; input 'y' has no data. Fix: send each input as "
        '{"name": "input-0", "shape": [1, 3], "datatype": "FP32", "data": [0.5, 1.0, 1.5]}'
    )


@pytest.mark.parametrize("dtype", ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                                   "float16", "float32", "float64"])  # fmt: skip
def test_each_numpy_dtype_names_a_datatype_whose_elements_it_holds(dtype):
    array = np.ones(3, dtype=dtype)
    datatype = DTYPE_DATATYPES[str(array.dtype)]
    assert datatype in DATATYPES
    assert tensor_problems({"name": "o", "shape": [3], "datatype": datatype, "data": array.tolist()}, "o") == []
    assert DTYPE_DATATYPES[np.array(["a"]).dtype.kind] == DTYPE_DATATYPES["object"] == "BYTES"


def test_other_names_pass_where_the_declaration_allows_them():
    declared = [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}]
    pixels = _input(name="pixels")
    assert input_problems([pixels], declared) == ["input 'pixels' is not one of the model's inputs (input-0)"]
    assert input_problems([pixels], declared, other_names=True) == []
    assert input_problems([pixels, _input(name="input-0")], declared, other_names=True) == [
        "input 'input-0' is FP32; the model declares it BYTES"
    ]
    assert input_problems([_input(name="pixels", shape=[3])], declared, other_names=True) == [
        "input 'pixels' shape [3] holds 3 elements, its data 4"  # the rule holds for every input
    ]
