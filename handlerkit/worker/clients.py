"""What a client of a served model sends and reads back, in a service envelope's form.

:func:`request` builds the JSON request a client of a model served with ``service_envelope=json``,
``kserve`` or ``kservev2`` sends (bytes as ``{"b64": ...}``, v2 tensors with their shape and
datatype inferred); :func:`unwrap_response` reads what the client gets back. The envelopes
themselves, what the worker does with such a request, are :mod:`handlerkit.worker.envelopes`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from handlerkit.errors import HandlerkitError
from handlerkit.worker.envelopes import get_envelope
from handlerkit.worker.requests import Request
from handlerkit.worker.v2_tensors import DTYPE_DATATYPES

__all__ = ["request", "unwrap_response"]

# What the request builder infers from plain Python values (first match wins).
_PY_DATATYPES: list[tuple[set[type], str]] = [
    ({bool}, "BOOL"),
    ({int}, "INT64"),
    ({int, float}, "FP64"),
    ({str}, "BYTES"),
]


def request(
    envelope: str,
    instances: Any = None,
    *,
    inputs: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
    id: str | None = None,
    headers: Mapping[str, str] | None = None,
    request_id: str | None = None,
) -> Request:
    """A JSON request as a client of a model served with ``envelope`` sends it.

    Args:
        envelope: ``"json"`` or ``"kserve"``: ``{"instances": [...]}``, bytes (instances or dict
            instances' values) sent as ``{"b64": ...}``; or ``"kservev2"``.
        instances: json/kserve: the instances; kservev2: the data of one input, ``"input-0"``.
        inputs: kservev2: ``{name: data}`` or input dicts; a missing ``shape``/``datatype`` is
            inferred from nested lists of bool/int/float/str, or from an array or tensor.
        id: kservev2: the body's ``id`` (the response echoes it; else the request id).
        headers: extra HTTP headers (``{"explain": "True"}``...).
        request_id: the request id (a fresh uuid by default).
    """
    name = get_envelope(envelope).name
    if name in ("json", "kserve"):
        if inputs is not None or id is not None:
            raise TypeError(f"inputs and id are for kservev2 requests, not {name}")
        if not isinstance(instances, (list, tuple)) or not instances:
            raise ValueError(f"a {name} request needs a non-empty list of instances: got {instances!r:.60}")
        body: dict[str, Any] = {"instances": [_b64(x, top=True) for x in instances]}
    elif name == "kservev2":
        if (instances is None) == (inputs is None):
            raise TypeError("a kservev2 request needs instances (one input) or inputs, not both")
        if inputs is None:
            inputs = {"input-0": instances}
        items = [{"name": k, "data": v} for k, v in inputs.items()] if isinstance(inputs, Mapping) else inputs
        body = ({"id": id} if id is not None else {}) | {"inputs": [_v2_input(inp) for inp in items]}
    else:
        raise ValueError("the body envelope passes any request through: build it with Request.json/from_file/...")
    return Request.json(body, headers=headers, request_id=request_id)


def _b64(value: Any, top: bool = False) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    return {k: _b64(v) for k, v in value.items()} if top and isinstance(value, dict) else value


def _v2_input(inp: Mapping[str, Any]) -> dict[str, Any]:
    if "name" not in inp or "data" not in inp:
        raise ValueError(f"a kservev2 input needs at least 'name' and 'data': got keys {sorted(inp)}")
    data = inp["data"]
    if all(hasattr(data, a) for a in ("shape", "dtype", "reshape")):  # a numpy array or a tensor
        shape, flat = list(data.shape), data.reshape(-1).tolist()
        dtype = DTYPE_DATATYPES.get(str(data.dtype).removeprefix("torch."))
    else:
        shape, flat = _shape_and_flat(data if isinstance(data, (list, tuple)) else [data])
        kinds = {type(x) for x in flat}
        dtype = next((t for types, t in _PY_DATATYPES if kinds and kinds <= types), None)
    if dtype is None and "datatype" not in inp:
        raise ValueError(f"cannot infer the datatype of input {inp['name']!r}: pass 'datatype'")
    return {
        "name": inp["name"],
        "shape": list(inp.get("shape", shape)),
        "datatype": inp.get("datatype", dtype),
        "data": flat,
    }


def _shape_and_flat(data: Sequence[Any]) -> tuple[list[int], list[Any]]:
    nested = [isinstance(x, (list, tuple)) for x in data]
    if not any(nested):
        return [len(data)], list(data)
    parts = [_shape_and_flat(row) if is_list else ([], [row]) for row, is_list in zip(data, nested)]
    if any(p[0] != parts[0][0] for p in parts):
        raise ValueError(f"kservev2 data must be rectangular: rows have shapes {[p[0] for p in parts]}")
    return [len(data), *parts[0][0]], [x for p in parts for x in p[1]]


def unwrap_response(envelope: str, item: Any) -> Any:
    """What a client reads from one response item (or its HTTP body, str/bytes, parsed as JSON).

    json/kserve: the predictions (or explanations); kservev2: ``{output name: flat data}``; body:
    the item itself.
    """
    name = get_envelope(envelope).name
    if name == "body":
        return item
    if isinstance(item, (str, bytes, bytearray)):
        item = json.loads(item)
    if isinstance(item, dict) and name == "kservev2" and isinstance(item.get("outputs"), list):
        return {out["name"]: out["data"] for out in item["outputs"]}
    key = next((k for k in ("predictions", "explanations") if isinstance(item, dict) and k in item), None)
    if key is None or name == "kservev2":
        raise HandlerkitError(f"not a {name} response item: {item!r:.80}", fix=f"pass one item of the {name} output")
    return item[key]
