"""TorchServe's service envelopes: request/response formats wrapped around a handler's ``handle``.

``service_envelope=json|kserve|kservev2`` in config.properties (or ``TS_SERVICE_ENVELOPE`` with
``enable_envvars_config=true``) is server-wide in TorchServe 0.12: the frontend writes it over every
model's manifest ``envelope`` and sends it in the worker's load request (model-config.yaml has no
key for it); ``ts/model_loader.py`` then wraps the entry point, ``Envelope(entry_point).handle``.
A function handler's initialisation call ``handle(None, context)`` bypasses the envelope, and an
unknown name fails the model load.

The classes here are handlerkit's own, with TorchServe's behaviour wherever a handler or a client
can notice it. Where TorchServe crashes inside the envelope or silently does something odd, they
raise :class:`~handlerkit.errors.RequestError` (a 400 naming the request) or
:class:`~handlerkit.errors.HandlerkitError`, with a fix; each docstring says what TorchServe does.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from handlerkit._text import did_you_mean
from handlerkit.errors import HandlerkitError, RequestError
from handlerkit.worker.v2_tensors import DTYPE_DATATYPES, EXAMPLE_INPUT, tensor_problems

__all__ = [
    "ENVELOPES",
    "BodyEnvelope",
    "Envelope",
    "JSONEnvelope",
    "KServeEnvelope",
    "KServeV2Envelope",
    "get_envelope",
    "wrap",
]

Handle = Callable[[Any, Any], Any]
_JSON_FIX = "send a JSON object with the header Content-Type: application/json"


class Envelope:
    """The shared ``handle``: parse the batch, call the handler, format its results.

    As TorchServe's ``BaseEnvelope``, an empty ``data`` reaches the handler as it is and falsy results
    (``None``, ``[]``) come back unformatted, for the worker to reject. TorchServe formats truthy
    results of an empty batch with stale state and crashes on an array's ambiguous truth value;
    handlerkit raises a HandlerkitError for both.
    """

    name: ClassVar[str] = ""

    def __init__(self, handle_fn: Handle) -> None:
        self._handle_fn = handle_fn
        self.context: Any = None

    def handle(self, data: list[Any], context: Any) -> Any:
        """Run the wrapped handler on ``data`` as the worker's entry point does."""
        self.context = context
        results = self._handle_fn(self.parse_input(data) if data else data, context)
        try:
            empty = not results
        except (RuntimeError, ValueError) as exc:
            raise HandlerkitError(
                f"under the {self.name} envelope the handler returned a {type(results).__name__}, whose truth "
                f"value is ambiguous (TorchServe's envelope fails on it: {exc})",
                fix="return a list (convert tensors and arrays with .tolist())",
            ) from exc
        if empty:
            return results
        if not data:
            raise HandlerkitError(
                f"the handler returned {type(results).__name__} {results!r:.60} for an empty batch; the "
                f"{self.name} envelope has no request to format it for",
                fix="return [] for an empty batch",
            )
        return self.format_output(results)

    def parse_input(self, data: list[Any]) -> Any:
        """What the handler receives instead of ``data``."""
        raise NotImplementedError

    def format_output(self, results: Any) -> Any:
        """What the worker sends back instead of the handler's ``results``."""
        raise NotImplementedError


def _body(row: Any, index: int) -> Any:
    # TorchServe takes a multipart "data" field first, then the raw body.
    if not isinstance(row, Mapping):
        raise RequestError(f"request {index}: expected a dict of parameters, got a {type(row).__name__}", index)
    return row.get("data") or row.get("body")


def _only_body(name: str, data: list[Any], keys: str) -> dict:
    """The kserve envelopes' one body, a dict; bytes are parsed as JSON as TorchServe does."""
    if len(data) > 1:
        raise HandlerkitError(
            f"the {name} envelope reads only the first request of a batch: got {len(data)} requests. TorchServe "
            "would run the handler on request 0 alone, then fail them all: 503 'number of batch response mismatched'",
            fix="set batchSize: 1 in model-config.yaml (KServe batches on its side), or use the json envelope",
        )
    body = _body(data[0], 0)
    if isinstance(body, (bytes, bytearray)):
        try:
            body = json.loads(bytes(body).decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError is a ValueError
            raise RequestError(f"request 0: the {name} body is not UTF-8 JSON ({exc})", 0, fix=_JSON_FIX) from exc
    if not isinstance(body, dict):
        raise RequestError(
            f"request 0: the {name} envelope needs a JSON object with {keys}: got a {type(body).__name__}",
            0,
            fix=_JSON_FIX,
        )
    return body


class BodyEnvelope(Envelope):
    """``service_envelope=body``: the handler gets each request's value (``data`` or ``body``)."""

    name = "body"

    def parse_input(self, data: list[Any]) -> list[Any]:
        return [_body(row, i) for i, row in enumerate(data)]

    def format_output(self, results: Any) -> Any:
        return results


class JSONEnvelope(Envelope):
    """``service_envelope=json`` (TF Serving's REST format).

    The handler gets the ``instances`` of every request joined into one list; when the first
    instance of a request is a dict, ``{"b64": ...}`` instances or dict values arrive decoded, as
    ``bytes``. Results are split back by each request's instance count; each request gets the
    string ``json.dumps({"predictions": [...]})``.

    TorchServe crashes (TypeError, KeyError, IndexError, AttributeError) on a body that is not a
    parsed JSON object, lacks ``instances``, has an empty list or mixes dicts and other instances;
    splits a string ``instances`` into characters; and hands out wrong predictions, silently, when
    the result count differs from the instance count.
    """

    name = "json"

    def __init__(self, handle_fn: Handle) -> None:
        super().__init__(handle_fn)
        self._lengths: list[int] = []

    def parse_input(self, data: list[Any]) -> list[Any]:
        batches = [self._instances(row, i) for i, row in enumerate(data)]
        self._lengths = [len(b) for b in batches]
        return [item for b in batches for item in b]

    def _instances(self, row: Any, index: int) -> list[Any]:
        body = _body(row, index) or row  # a row without data/body is read as the body itself
        if not isinstance(body, dict):
            raise RequestError(
                f"request {index}: the json envelope needs a parsed JSON object with 'instances': got "
                f"a {type(body).__name__} (TorchServe fails with a TypeError)",
                index,
                fix=_JSON_FIX,
            )
        rows = body.get("instances")
        if not isinstance(rows, list) or not rows:
            got = f"'instances': {rows!r:.60}" if "instances" in body else f"keys {sorted(body)}"
            raise RequestError(
                f"request {index}: the json envelope needs a non-empty list under 'instances': got {got}",
                index,
                fix='send {"instances": [instance, ...]}',
            )
        if not isinstance(rows[0], dict):
            return rows
        out = []
        for j, item in enumerate(rows):
            if not isinstance(item, dict):
                raise RequestError(
                    f"request {index}: instance {j} is a {type(item).__name__} but instance 0 is an "
                    "object; the json envelope needs all or none of them to be objects",
                    index,
                )
            try:
                out.append(
                    base64.b64decode(item["b64"])
                    if list(item) == ["b64"]
                    else {
                        k: base64.b64decode(v["b64"]) if isinstance(v, dict) and list(v) == ["b64"] else v
                        for k, v in item.items()
                    }
                )
            except (binascii.Error, TypeError, ValueError) as exc:
                raise RequestError(f"request {index}: instance {j} holds invalid base64 ({exc})", index) from exc
        return out

    def format_output(self, results: Any) -> list[str]:
        total = sum(self._lengths)
        if not isinstance(results, (list, tuple)) or len(results) != total:
            got = f"{len(results)} items" if isinstance(results, (list, tuple)) else f"a {type(results).__name__}"
            raise HandlerkitError(
                f"under the json envelope the handler must return one item per instance: got {got} for {total} "
                f"instances (requests of {', '.join(map(str, self._lengths))})",
                fix="return a list as long as the list the handler received",
            )
        out, cursor = [], 0
        for i, n in enumerate(self._lengths):
            try:
                out.append(json.dumps({"predictions": results[cursor : cursor + n]}))
            except (TypeError, ValueError) as exc:
                raise HandlerkitError(
                    f"the predictions for request {i} are not JSON-serialisable ({exc})",
                    fix="convert tensors and arrays with .tolist()",
                ) from exc
            cursor += n
        return out


class KServeEnvelope(Envelope):
    """``service_envelope=kserve`` (KServe v1 protocol).

    The handler gets the ``instances`` of the body (bytes are parsed as JSON) as they are; the
    results come back as ``[{"predictions": results}]``, ``"explanations"`` when the request has
    the header ``explain: True``. TorchServe reads only request 0 of a batch (then fails it with
    503), hands the handler ``None`` when ``instances`` is missing, and crashes on a str body.
    """

    name = "kserve"

    def parse_input(self, data: list[Any]) -> Any:
        body = _only_body(self.name, data, "'instances'")
        if body.get("instances") is None:
            raise RequestError(
                f"request 0: the kserve body has no 'instances': keys {sorted(body)}",
                0,
                fix='send {"instances": [instance, ...]}',
            )
        return body["instances"]

    def format_output(self, results: Any) -> list[dict[str, Any]]:
        explain = self.context is not None and self.context.get_request_header(0, "explain") == "True"
        return [{"explanations" if explain else "predictions": results}]


class KServeV2Envelope(Envelope):
    """``service_envelope=kservev2`` (KServe v2 / Open Inference protocol).

    The handler gets the body's ``inputs``, each with its ``data`` reshaped to ``shape`` by numpy
    (the datatype is not applied) or, for ``BYTES``, ``data[0]`` alone; ``context.input_names``
    (and ``context.input_request_id`` for a non-blank ``id``) are set. Result ``i`` becomes output
    ``i``, named after input ``i``, flattened, ``shape`` a tuple: ``[{"id", "model_name",
    "model_version", "outputs"}]``, ``id`` being the body's, else the request id.

    TorchServe reads only request 0 (then fails the batch with 503); crashes with KeyError,
    ValueError, IndexError or AttributeError on a missing key, data that does not fit its shape, a
    non-str ``id``, more results than inputs or a dtype v2 cannot name; reuses a stale ``id``
    after a call whose results were empty. It checks nothing else: a ``-1`` dimension, a shape
    a ``BYTES`` input's data does not fill, or elements that are not of the datatype reach the
    handler. Here each input is held to the v2 tensor rule first (:func:`handlerkit.worker.v2_tensors.tensor_problems`,
    as the KServe server holds it), and one that breaks it is a :class:`RequestError` naming every problem.
    """

    name = "kservev2"

    def parse_input(self, data: list[Any]) -> list[dict[str, Any]]:
        body = _only_body(self.name, data, "'inputs'")
        if not isinstance(body.get("inputs"), list):
            got = body.get("inputs")
            raise RequestError(
                f"request 0: the kservev2 body needs a list under 'inputs': got {got!r:.60}",
                0,
                fix='send {"inputs": [{"name", "shape", "datatype", "data"}, ...]}',
            )
        parsed = [self._input(inp, k) for k, inp in enumerate(body["inputs"])]
        rid = body.get("id")
        if rid and not isinstance(rid, str):
            raise RequestError(f"request 0: the kservev2 'id' must be a string: got {rid!r}", 0)
        self.context.input_names = [inp["name"] for inp in parsed]
        if rid and rid.strip():
            self.context.input_request_id = rid
        elif hasattr(self.context, "input_request_id"):
            del self.context.input_request_id
        return parsed

    @staticmethod
    def _input(inp: Any, k: int) -> dict[str, Any]:
        name = inp.get("name") if isinstance(inp, dict) else None
        where = f"kservev2 input {name!r}" if isinstance(name, str) else f"kservev2 input {k}"
        problems = tensor_problems(inp, where)
        if problems:
            raise RequestError(f"request 0: {'; '.join(problems)}", 0, fix=f"send each input as {EXAMPLE_INPUT}")
        if inp["datatype"] == "BYTES":
            if not inp["data"]:
                raise RequestError(f"request 0: BYTES input {name!r} needs a non-empty data list", 0)
            return {**inp, "data": inp["data"][0]}  # TorchServe's: nested BYTES data gives its first row
        import numpy as np

        return {**inp, "data": np.array(inp["data"]).reshape(tuple(inp["shape"])).tolist()}

    def format_output(self, results: Any) -> list[dict[str, Any]]:
        ctx = self.context
        names = getattr(ctx, "input_names", [])
        if not isinstance(results, (list, tuple)) or len(results) > len(names):
            got = f"{len(results)} results" if isinstance(results, (list, tuple)) else f"a {type(results).__name__}"
            raise HandlerkitError(
                f"under the kservev2 envelope the handler must return a list of at most one result "
                f"per input: got {got} for inputs {names}",
                fix="return [output for input 0, output for input 1, ...]",
            )
        rid = getattr(ctx, "input_request_id", None) or ctx.get_request_id(0)
        for attr in ("input_names", "input_request_id"):
            if hasattr(ctx, attr):
                delattr(ctx, attr)
        model = (getattr(ctx, "manifest", None) or {}).get("model") or {}
        outputs = [self._output(item, names[i]) for i, item in enumerate(results)]
        return [
            {
                "id": rid,
                "model_name": model.get("modelName"),
                "model_version": model.get("modelVersion"),
                "outputs": outputs,
            }
        ]

    @staticmethod
    def _output(item: Any, name: str) -> dict[str, Any]:
        import numpy as np

        try:
            if hasattr(item, "numpy") and type(item).__module__.startswith("torch"):
                item = item.numpy()  # what np.array(tensor) does, without numpy 2's copy-keyword warning
            flat = np.array(item).flatten()
        except Exception as exc:  # CUDA or bfloat16 tensors, ragged lists...
            raise HandlerkitError(
                f"output {name!r} cannot become a numpy array ({exc})",
                fix="return nested lists or CPU tensors (.cpu().tolist())",
            ) from exc
        datatype = DTYPE_DATATYPES.get(str(flat.dtype)) or DTYPE_DATATYPES.get(flat.dtype.kind)
        if datatype is None:
            raise HandlerkitError(
                f"output {name!r} has dtype {flat.dtype}, which KServe v2 cannot name",
                fix="return bool, int, float or str values",
            )
        return {"name": name, "datatype": datatype, "data": flat.tolist(), "shape": flat.shape}


#: ``service_envelope`` name → class: a module of ``ts/torch_handler/request_envelope`` each (``base`` is abstract).
ENVELOPES: dict[str, type[Envelope]] = {
    c.name: c for c in (BodyEnvelope, JSONEnvelope, KServeEnvelope, KServeV2Envelope)
}


def get_envelope(name: str) -> type[Envelope]:
    """The envelope class for a ``service_envelope`` name (exact, as TorchServe imports it)."""
    if not isinstance(name, str):
        raise TypeError(f"an envelope name is a str: got {type(name).__name__}")
    if name in ENVELOPES:
        return ENVELOPES[name]
    guess = did_you_mean(name, ENVELOPES)
    raise HandlerkitError(
        f"unknown service envelope {name!r}: TorchServe 0.12 knows {', '.join(ENVELOPES)} (with another name its "
        "worker fails to load the model)" + (f"; did you mean {guess!r}?" if guess else ""),
        fix=f"use service_envelope={guess or 'json'}",
    )


def wrap(handle: Handle, name: str | None) -> Handle:
    """``handle`` wrapped in envelope ``name`` as the worker does; None or ``""``: no envelope.

    The result is the envelope's bound ``handle`` (``.__self__`` is the envelope); keep one for the
    model's lifetime, as the worker does.
    """
    return get_envelope(name)(handle).handle if name else handle
