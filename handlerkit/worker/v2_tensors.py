"""The Open Inference Protocol v2 tensor rule, written once.

The protocol is KServe's "V2" (``kserve/kserve`` ``docs/predict-api/v2/required_api.md``): a
tensor is ``{"name", "datatype", "shape", "data"}``; the datatype is one of the spec's table
(:data:`DATATYPES`); the data is flat or nested as the shape, holding as many elements as the
shape's product, each of the datatype (booleans for ``BOOL``, strings for ``BYTES``, integers for
the ``INT``/``UINT`` types, numbers for ``FP``); a dimension is an integer >= 0, except in a
model's metadata, where ``-1`` declares one whose size each request chooses. An error is answered
``{"error": "<message>"}`` (:func:`error_body`).

Everything that reads v2 tensors asks here: the ``kservev2`` envelope (:mod:`handlerkit.worker.envelopes`),
the ``v2:`` section of model-config.yaml (:mod:`handlerkit.worker.config`), the KServe server's inference
route and metadata (:mod:`handlerkit.serving.v2`), and the protocol check
(:mod:`handlerkit.serving.v2_check`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from handlerkit._validate import is_int

__all__ = [
    "DATATYPES",
    "DTYPE_DATATYPES",
    "EXAMPLE_INPUT",
    "element_kind",
    "error_body",
    "flat",
    "input_problems",
    "invalid_request_message",
    "metadata_problems",
    "nest",
    "tensor_problems",
]

#: The tensor datatypes of the spec's "Tensor Data Types" table.
DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
)  # fmt: skip

#: The datatype of a numpy (or torch) dtype name, else of a numpy dtype kind, as TorchServe's
#: ``kservev2`` envelope names its outputs.
DTYPE_DATATYPES: Mapping[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "object": "BYTES",
    "U": "BYTES",
}

#: One well-formed request input, for the fix of a message.
EXAMPLE_INPUT = '{"name": "input-0", "shape": [1, 3], "datatype": "FP32", "data": [0.5, 1.0, 1.5]}'


def flat(data: Any) -> list[Any]:
    """Tensor data, flat or nested as the spec allows, as one flat list (a scalar is one element)."""
    if isinstance(data, list):
        return [value for item in data for value in flat(item)]
    return [data]


def nest(values: Sequence[Any], shape: Sequence[int]) -> Any:
    """Flat ``values`` nested as ``shape`` (row-major), the spec's other form of the same data."""
    if len(shape) <= 1:
        return list(values)
    step = len(values) // shape[0] if shape[0] else 0
    return [nest(values[k * step : (k + 1) * step], shape[1:]) for k in range(shape[0])]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def element_kind(datatype: str) -> tuple[str, Callable[[Any], bool]]:
    """What one element of ``datatype`` is, in words, and the test of it."""
    if datatype == "BOOL":
        return "booleans", lambda v: isinstance(v, bool)
    if datatype == "BYTES":
        return "strings", lambda v: isinstance(v, (str, bytes))
    if datatype.startswith("FP"):
        return "numbers", _is_number
    return "integers", is_int


def tensor_problems(tensor: Any, where: str, *, declared: bool = False, elements: bool = True) -> list[str]:
    """What one tensor breaks (empty when none), each problem starting with ``where``.

    Args:
        tensor: the tensor as JSON data.
        where: how messages name it (``"input 'x'"``, ``"outputs[0]"``).
        declared: a model's metadata tensor: no ``data``, and ``-1`` dimensions allowed.
        elements: check each element against the datatype (else only the count).
    """
    if not isinstance(tensor, Mapping):
        return [f"{where} is {type(tensor).__name__}, not an object"]
    problems = (
        [] if isinstance(tensor.get("name"), str) else [f"{where} has no string name: got {tensor.get('name')!r}"]
    )
    datatype, shape = tensor.get("datatype"), tensor.get("shape")
    if datatype not in DATATYPES:
        problems.append(f"{where} datatype {datatype!r} is none of {', '.join(DATATYPES)}")
    least = -1 if declared else 0
    if not isinstance(shape, list) or not all(is_int(d) and d >= least for d in shape):
        problems.append(f"{where} shape {shape!r} is not a list of integers >= {least}")
    if declared:
        return problems
    if "data" not in tensor:
        problems.append(f"{where} has no data")
    elif not problems:  # the shape is a list of integers
        values, size = flat(tensor["data"]), math.prod(tensor["shape"])
        if size != len(values):
            problems.append(f"{where} shape {shape} holds {size} elements, its data {len(values)}")
        words, fits = element_kind(str(datatype))
        wrong = [v for v in values if not fits(v)] if elements else []
        if wrong:
            problems.append(f"{where} is {datatype}: its data must be {words}, got {wrong[0]!r:.40}")
    return problems


def input_problems(inputs: Any, declared: Sequence[Mapping[str, Any]] = (), *, other_names: bool = False) -> list[str]:
    """What a request's ``inputs`` break (empty when none); each problem names its input.

    Args:
        inputs: the request's ``inputs``.
        declared: the model's metadata inputs; an input of a declared name must have its
            datatype and fit its shape (a ``-1`` dimension takes any size).
        other_names: whether an input the metadata does not name passes (checked by the rule
            alone), as TorchServe's built-in handlers read any input name; else it is refused.
    """
    if not isinstance(inputs, list) or not inputs:
        return [f"expected a non-empty list of input tensors under 'inputs': got {inputs!r:.60}"]
    known = {str(t.get("name")): t for t in declared if isinstance(t, Mapping)}
    problems = []
    for k, tensor in enumerate(inputs):
        name = tensor.get("name") if isinstance(tensor, Mapping) else None
        where = f"input {name!r}" if isinstance(name, str) else f"inputs[{k}]"
        found = tensor_problems(tensor, where)
        if known and isinstance(name, str) and not (other_names and name not in known):
            found += _declared_problems(tensor, where, known)
        problems += found
    return problems


def _declared_problems(tensor: Mapping[str, Any], where: str, known: Mapping[str, Mapping[str, Any]]) -> list[str]:
    name = tensor["name"]
    if name not in known:
        return [f"{where} is not one of the model's inputs ({', '.join(known)})"]
    want, datatype, shape = known[name], tensor.get("datatype"), tensor.get("shape")
    if datatype in DATATYPES and want.get("datatype") != datatype:
        return [f"{where} is {datatype}; the model declares it {want.get('datatype')}"]
    wanted = want.get("shape")
    if isinstance(shape, list) and isinstance(wanted, list):
        fits = len(shape) == len(wanted) and all(w in (-1, d) for w, d in zip(wanted, shape))
        if not fits:
            return [f"{where} has shape {shape}; the model declares {wanted} (-1: any size)"]
    return []


def metadata_problems(tensors: Any, where: str) -> list[str]:
    """What a list of declared tensors (a model's metadata ``inputs`` or ``outputs``) breaks."""
    if not isinstance(tensors, list):
        return [f"{where} is {type(tensors).__name__}, not a list of tensors"]
    problems = [p for i, t in enumerate(tensors) for p in tensor_problems(t, f"{where}[{i}]", declared=True)]
    names = [t.get("name") for t in tensors if isinstance(t, Mapping)]
    twice = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if twice:
        problems.append(f"{where} names {', '.join(map(repr, twice))} more than once")
    return problems


def invalid_request_message(problems: Sequence[str]) -> str:
    """The message of a request whose inputs break the rule: every problem, then the fix."""
    return f"invalid v2 inference request: {'; '.join(problems)}. Fix: send each input as {EXAMPLE_INPUT}"


def error_body(message: str) -> dict[str, str]:
    """The spec's error body: ``{"error": message}``."""
    return {"error": message}
