"""The Open Inference Protocol v2 rules the KServe adapter keeps on its ``/v2/models/<m>/infer``
route, on top of TorchServe's ``kservev2`` envelope (which checks almost nothing, as TorchServe):

- each input tensor is checked before the handler runs (:func:`input_problems`): a string name;
  a datatype of the spec's table; a shape of non-negative integers whose product is the number
  of elements in ``data`` (flat or nested); elements of the datatype (booleans for ``BOOL``,
  strings for ``BYTES``, numbers otherwise); and, where the model's metadata declares inputs,
  a declared name with its declared datatype. A request that breaks any is answered 400 alone;
- every v2 error is the spec's ``{"error": "<message>"}`` (:func:`error_reply`), with the status
  TorchServe gives and TorchServe's message, so a v2 client (``tritonclient``) shows it;
- a body FastAPI cannot read as an inference request (malformed JSON, no ``inputs``) is answered
  400 ``{"error": ...}`` (:func:`request_validation_response`) instead of FastAPI's 422
  ``{"detail": [...]}``; other routes keep FastAPI's answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from handlerkit.serving._http import Reply
from handlerkit.serving.v2_check import DATATYPES

__all__ = ["error_reply", "input_problems", "invalid_request", "request_validation_response"]

_INPUT = '{"name": "input-0", "shape": [1, 3], "datatype": "FP32", "data": [0.5, 1.0, 1.5]}'
_MESSAGE_CHARS = 2000  # of a body that holds no message of its own


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flat(data: Any) -> list[Any]:
    """Tensor data, flat or nested as the spec allows, as one flat list."""
    if isinstance(data, list):
        return [value for item in data for value in _flat(item)]
    return [data]


def _element_kind(datatype: str) -> tuple[str, Any]:
    """What one element of ``datatype`` is, in words, and the test of it."""
    if datatype == "BOOL":
        return "booleans", lambda v: isinstance(v, bool)
    if datatype == "BYTES":
        return "strings", lambda v: isinstance(v, (str, bytes))
    if datatype.startswith("FP"):
        return "numbers", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    return "integers", _is_int


def _tensor_problems(tensor: Any, k: int, declared: Mapping[str, str]) -> list[str]:
    """What input ``k`` breaks, each naming the input."""
    if not isinstance(tensor, Mapping):
        return [f"inputs[{k}] is {type(tensor).__name__}, not an object"]
    name = tensor.get("name")
    where = f"input {name!r}" if isinstance(name, str) else f"inputs[{k}]"
    problems = [] if isinstance(name, str) else [f"inputs[{k}] has no string name: got {name!r}"]
    datatype, shape = tensor.get("datatype"), tensor.get("shape")
    if datatype not in DATATYPES:
        problems.append(f"{where} datatype {datatype!r} is none of {', '.join(DATATYPES)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        problems.append(f"{where} shape {shape!r} is not a list of integers >= 0")
    if "data" not in tensor:
        problems.append(f"{where} has no data")
    elif isinstance(shape, list) and not problems:
        values = _flat(tensor["data"])
        if math.prod(shape) != len(values):
            problems.append(f"{where} shape {shape} holds {math.prod(shape)} elements, its data {len(values)}")
        words, fits = _element_kind(str(datatype))
        wrong = [v for v in values if not fits(v)]
        if wrong:
            problems.append(f"{where} is {datatype}: its data must be {words}, got {wrong[0]!r:.40}")
    if declared and isinstance(name, str):
        if name not in declared:
            problems.append(f"{where} is not one of the model's inputs ({', '.join(declared)})")
        elif datatype in DATATYPES and declared[name] != datatype:
            problems.append(f"{where} is {datatype}; the model declares it {declared[name]}")
    return problems


def input_problems(inputs: Any, declared: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """What the request's ``inputs`` break (empty when none): each problem names its input.

    ``declared``: the model's metadata inputs (``get_input_types()``); names and datatypes are
    checked against them when there are any.
    """
    if not isinstance(inputs, list) or not inputs:
        return [f"expected a non-empty list of input tensors under 'inputs': got {inputs!r:.60}"]
    known = {str(t.get("name")): str(t.get("datatype")) for t in declared if isinstance(t, Mapping)}
    return [problem for k, tensor in enumerate(inputs) for problem in _tensor_problems(tensor, k, known)]


def _body(message: str, status: int) -> Reply:
    body = json.dumps({"error": message}).encode("utf-8")
    return Reply(status, None, {"content-type": "application/json"}, body)


def invalid_request(problems: Sequence[str]) -> Reply:
    """The 400 answer to inputs that break the spec: every problem, then the fix."""
    return _body(f"invalid v2 inference request: {'; '.join(problems)}. Fix: send each input as {_INPUT}", 400)


def error_reply(reply: Reply) -> Reply:
    """A non-200 reply the v2 way: the same status, ``{"error": <TorchServe's message>}``."""
    return _body(_message(reply), reply.status)


def _message(reply: Reply) -> str:
    """TorchServe's message in a reply: an error document's ``message``; the ``error`` of each
    output item a handler answered with its own status; else the reason phrase and the body."""
    text = reply.body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("message", "error"):
            if isinstance(doc.get(key), str):
                return str(doc[key])
        outputs: list[Any] = doc["outputs"] if isinstance(doc.get("outputs"), list) else []
        errors = [
            str(item["error"])
            for output in outputs
            if isinstance(output, dict)
            for item in _flat(output.get("data"))
            if isinstance(item, dict) and isinstance(item.get("error"), str)
        ]
        if errors:
            return "; ".join(errors)
    shown = text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "…"
    return f"{reply.phrase}: {shown}" if reply.phrase else shown


async def request_validation_response(request: Any, exc: Any) -> Any:
    """FastAPI's ``RequestValidationError`` handler: on a v2 route, 400 ``{"error": ...}`` naming
    what FastAPI found wrong; elsewhere FastAPI's own 422 answer."""
    from fastapi.exception_handlers import request_validation_exception_handler
    from fastapi.responses import JSONResponse

    if not request.url.path.startswith("/v2/"):
        return await request_validation_exception_handler(request, exc)
    message = (
        f"expected a v2 inference request, a JSON object with 'inputs': {_found(exc.errors())}. "
        f'Fix: send {{"inputs": [{_INPUT}]}}'
    )
    return JSONResponse({"error": message}, status_code=400)


def _found(errors: Sequence[Mapping[str, Any]]) -> str:
    """FastAPI's validation errors in words: where (``inputs``, not ``body.InferenceRequest.inputs``)
    and what; the raw-bytes alternative of kserve's ``Union[InferenceRequest, bytes]`` left out."""
    shown = []
    for error in errors:
        where = [str(part) for part in error.get("loc", ()) if part not in ("body", "InferenceRequest")]
        if where[:1] == ["bytes"]:
            continue
        if error.get("type") == "json_invalid":
            shown.append(f"malformed JSON at character {where[-1] if where else '?'}")
        else:
            shown.append(f"{'.'.join(where) or 'the body'}: {error.get('msg', '?')}")
    return "; ".join(shown) or "the body is not one"
