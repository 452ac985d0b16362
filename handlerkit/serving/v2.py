"""The Open Inference Protocol v2 as servers here speak it: the tensor rule
(:mod:`handlerkit.worker.v2_tensors`, re-exported), the spec's error replies, and what a model declares
in its metadata (``GET /v2/models/<name>``).

- a request whose inputs break the rule is answered 400 ``{"error": ...}`` naming every problem
  (:func:`invalid_request`), before the handler sees it;
- any other non-200 reply of the worker is answered with the same status and
  ``{"error": <TorchServe's message>}`` (:func:`as_v2_error`), so a v2 client (``tritonclient``)
  shows it;
- a model's metadata inputs and outputs (:func:`declared_tensors`) come from the ``v2:`` section
  of its model-config.yaml, else from its handler's ``v2_metadata`` (the built-ins declare
  theirs), else none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from handlerkit.errors import HandlerkitError
from handlerkit.serving._http import Reply
from handlerkit.worker.v2_tensors import (
    DATATYPES,
    EXAMPLE_INPUT,
    error_body,
    flat,
    input_problems,
    invalid_request_message,
    metadata_problems,
    nest,
    tensor_problems,
)

__all__ = [
    "DATATYPES",
    "EXAMPLE_INPUT",
    "as_v2_error",
    "declared_tensors",
    "error_body",
    "flat",
    "input_problems",
    "invalid_request",
    "metadata_problems",
    "nest",
    "tensor_problems",
]

_MESSAGE_CHARS = 2000  # of a body that holds no message of its own


def declared_tensors(config: Mapping[str, Any] | None, handler: Any) -> dict[str, Any]:
    """The inputs and outputs a model declares: model-config.yaml's ``v2:`` section (checked when
    the config is read, :mod:`handlerkit.worker.config`), else the handler's ``v2_metadata``, else none;
    and ``other_names``, whether a request's inputs of other names pass (the handler's
    declaration: a built-in reads any input name, and pixels as well as an encoded image, as in
    TorchServe; the config's is the model's whole contract).

    Raises:
        HandlerkitError: the handler's ``v2_metadata`` is no ``{"inputs": [...], "outputs": [...]}``
            of ``{name, datatype, shape}`` tensors.
    """
    section = (config or {}).get("v2")
    if section is None:
        section = getattr(handler, "v2_metadata", None)
        if section is None:
            return {"inputs": [], "outputs": [], "other_names": False}
        owner = f"{type(handler).__name__}.v2_metadata"
        if isinstance(section, Mapping):
            problems = [p for key in ("inputs", "outputs") for p in metadata_problems(section.get(key, []), key)]
        else:
            problems = [f"it is {type(section).__name__}, not a mapping"]
        if problems:
            raise HandlerkitError(
                f"{owner} declares no v2 metadata: {'; '.join(problems)}",
                fix='declare {"inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}], "outputs": [...]} '
                "(or a v2: section in model-config.yaml)",
            )
    tensors = {key: [dict(t) for t in section.get(key) or []] for key in ("inputs", "outputs")}
    return {**tensors, "other_names": "v2" not in (config or {})}


def _reply(message: str, status: int) -> Reply:
    body = json.dumps(error_body(message)).encode("utf-8")
    return Reply(status, None, {"content-type": "application/json"}, body)


def invalid_request(problems: list[str]) -> Reply:
    """The 400 answer to inputs that break the rule: every problem, then the fix."""
    return _reply(invalid_request_message(problems), 400)


def as_v2_error(reply: Reply) -> Reply:
    """A non-200 reply of the worker the v2 way: the same status, ``{"error": <TorchServe's message>}``."""
    return _reply(_message(reply), reply.status)


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
            for item in flat(output.get("data"))
            if isinstance(item, dict) and isinstance(item.get("error"), str)
        ]
        if errors:
            return "; ".join(errors)
    shown = text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "…"
    return f"{reply.phrase}: {shown}" if reply.phrase else shown
