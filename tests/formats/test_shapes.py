"""handlerkit.formats.shapes: each runtime's refusal of an input size, named and with the re-export."""

from __future__ import annotations

import pytest
import torch

from handlerkit.formats import ArtifactShapeError, shape_refusal

NAMES = ["user_ids", "item_ids", "mask"]


@pytest.mark.parametrize(
    ("fmt", "text", "names", "refused"),
    [
        ("aoti", "input_handles[1]: unmatched dim value at 1, expected: 7, but got: 2\n", NAMES, ("item_ids", 1, "= 7", 2)),
        ("aoti-so", "input_handles[1]: unmatched dim value at 1, expected: 7, but got: 2", None, ("input 1", 1, "= 7", 2)),
        ("aoti", "input_handles[0]: dim value is too large at 0, expected to be <= 1024, but got: 1025", NAMES,
         ("user_ids", 0, "<= 1024", 1025)),
        ("export", "Guard failed: 2 <= item_ids.size()[1]", NAMES, ("item_ids", 1, ">= 2", None)),
        ("onnx", "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: mask for the "
         "following indices\n index: 1 Got: 3 Expected: 7\n Please fix either the inputs/outputs or the model.",
         NAMES, ("mask", 1, "= 7", 3)),
    ],
)  # fmt: skip
def test_shape_refusal_reads_each_runtimes_message(fmt, text, names, refused):
    error = shape_refusal(RuntimeError(text), f"/models/recs/model.{fmt}", fmt, names)
    assert isinstance(error, ArtifactShapeError) and isinstance(error, RuntimeError)
    assert error.refused == [refused] and (error.input, error.dim, error.expected, error.got) == refused
    assert error.message.startswith(f"model.{fmt} was exported for {refused[0]} dim {refused[1]} {refused[2]}")
    assert error.message.endswith(f"({text.strip().splitlines()[0]})")
    lab = "aoti" if fmt == "aoti-so" else fmt
    command = f"handlerkit formats /models/recs FILES --formats {lab} --save {lab} --replace"
    if refused[1] == 0:
        assert error.fix.startswith(f"re-export it with a dynamic batch: {command} (in a notebook")
    else:
        name = refused[0].split()[-1]
        assert f"{command} --dynamic {name}:1 (in a notebook" in error.fix


def test_shape_refusal_names_every_fixed_dimension_the_call_misses():
    inputs = (torch.zeros(1), torch.zeros(1, 2), torch.zeros(1, 2))
    error = shape_refusal(
        RuntimeError("Guard failed: mask.size()[1] == 7"), "model.pt2", "export", NAMES, inputs, [{}, {1: 7}, {1: 7}]
    )
    assert error is not None and error.refused == [("item_ids", 1, "= 7", 2), ("mask", 1, "= 7", 2)]
    assert (
        error.message
        == "model.pt2 was exported for item_ids dim 1 = 7 and mask dim 1 = 7; this call gives 2 and 2 (Guard failed: mask.size()[1] == 7)"
    )
    assert "dynamic_shapes={'item_ids': [1], 'mask': [1]}" in error.fix
    assert shape_refusal(RuntimeError("index out of range in self"), "model.pt2", "export", NAMES) is None
