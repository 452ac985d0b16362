"""FastAPI's answer to a body it cannot read as a v2 inference request, the v2 way.

A body FastAPI cannot parse as kserve's ``InferenceRequest`` (malformed JSON, no ``inputs``) is
answered 400 ``{"error": ...}`` (:func:`request_validation_response`) instead of FastAPI's 422
``{"detail": [...]}``; other routes keep FastAPI's answer. The v2 rule itself, and the other error
replies, are :mod:`handlerkit.serving.v2`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from handlerkit.worker.v2_tensors import EXAMPLE_INPUT, error_body

__all__ = ["request_validation_response"]


async def request_validation_response(request: Any, exc: Any) -> Any:
    """FastAPI's ``RequestValidationError`` handler: on a v2 route, 400 ``{"error": ...}`` naming
    what FastAPI found wrong; elsewhere FastAPI's own 422 answer."""
    from fastapi.exception_handlers import request_validation_exception_handler
    from fastapi.responses import JSONResponse

    if not request.url.path.startswith("/v2/"):
        return await request_validation_exception_handler(request, exc)
    message = (
        f"expected a v2 inference request, a JSON object with 'inputs': {_found(exc.errors())}. "
        f'Fix: send {{"inputs": [{EXAMPLE_INPUT}]}}'
    )
    return JSONResponse(error_body(message), status_code=400)


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
