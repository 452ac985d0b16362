"""Per-request errors, shared by every built-in handler: a bad request is answered alone.

TorchServe's built-in handlers fail the whole batch when one request cannot be read.
handlerkit's answer that request in its own slot and the others as usual:

* the request's :class:`~handlerkit.errors.RequestError` (made with :func:`refuse`) is recorded
  by its index and its status is set with ``context.set_response_status(code, phrase, idx)``
  (:func:`fail`, :func:`set_status`), before the request reaches the model;
* its answer is the error item ``{"code": 400, "error": what is wrong, "fix": what to send}``
  (:func:`error_item`), put back at its index among the answers of the readable requests
  (:func:`put_back`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from handlerkit.errors import RequestError

__all__ = ["STATUS_PHRASES", "error_item", "fail", "payload_kind", "put_back", "refuse", "set_status"]

#: The reason phrase sent with each status code a request's error can have.
STATUS_PHRASES = {400: "Bad Request", 413: "Payload Too Large"}

_JSON_KINDS = {
    dict: "a JSON object",
    list: "a JSON array",
    bool: "a JSON boolean",
    int: "a JSON number",
    float: "a JSON number",
}


def refuse(index: int, what: str, fix: str, code: int = 400) -> RequestError:
    """The error of request ``index``: ``"request 3: <what>"``, its status code and its fix."""
    return RequestError(f"request {index}: {what}", index, code, fix=fix)


def payload_kind(payload: Any) -> str:
    """What a request's payload is, in a client's words: ``"a JSON object"``, ``"a bytes"``..."""
    return _JSON_KINDS.get(type(payload), f"a {type(payload).__name__}")


def set_status(context: Any, index: int, error: RequestError) -> None:
    """Set request ``index``'s status to the error's code and phrase, when ``context`` has
    ``set_response_status`` (TorchServe's has)."""
    if context is not None and hasattr(context, "set_response_status"):
        code = error.error_code
        context.set_response_status(code, STATUS_PHRASES.get(code, "Bad Request"), index)


def fail(errors: MutableMapping[int, RequestError], index: int, error: RequestError, context: Any) -> None:
    """Record request ``index``'s error in ``errors`` and set its status (:func:`set_status`)."""
    errors[index] = error
    set_status(context, index, error)


def error_item(error: RequestError) -> dict[str, Any]:
    """A failed request's answer: ``{"code": 400, "error": what is wrong, "fix": what to send}``."""
    prefix = f"request {error.request_index}: "
    return {"code": error.error_code, "error": error.reason.removeprefix(prefix), "fix": error.fix}


def put_back(answers: Any, errors: Mapping[int, RequestError], size: int) -> Any:
    """``answers`` (one per readable request, in order) with each failed request's error item
    put back at its index, for a batch of ``size`` requests.

    Anything else is returned as it is: a value that is not a list, and a list that is not one
    answer per readable request (one per request already, for instance). So putting the items
    back a second time changes nothing.
    """
    if not errors or not isinstance(answers, list) or len(answers) != size - len(errors):
        return answers
    readable = iter(answers)
    return [error_item(errors[i]) if i in errors else next(readable) for i in range(size)]
