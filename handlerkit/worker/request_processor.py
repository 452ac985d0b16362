"""Each request's headers in and its response out, as TorchServe 0.12's ``ts/context.py`` keeps them.

- :class:`RequestProcessor` holds one request's headers and the response status and headers
  the handler sets for it, with TorchServe's method names.
- :func:`bind_requests` gives a context a new batch, as the worker does before every call;
  :func:`read_responses` (and :class:`ResponseInfo`) read back what the handler set.

Both work on handlerkit's :class:`~handlerkit.worker.context.MockContext` (which re-exports these
names) and on TorchServe's ``ts.context.Context``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["RequestProcessor", "ResponseInfo", "bind_requests", "read_responses"]


class RequestProcessor:
    """One request's headers in, its response status and headers out (``ts.context.RequestProcessor``).

    The header dict is kept by reference, as TorchServe does. It holds the request-level HTTP
    headers plus, for each input parameter, ``{param name: {"content-type": ...}}``.

    Args:
        request_header: the request's headers, as the worker builds them.
    """

    def __init__(self, request_header: dict) -> None:
        self._status_code: int = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = request_header

    def get_request_property(self, key: str) -> Any:
        """The request header ``key`` (exact, case-sensitive name), or None."""
        return self._request_header.get(key)

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        """Set this request's HTTP status code and reason phrase."""
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        """The status code set so far (200 by default)."""
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        """The reason phrase set so far (None by default)."""
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        """Set a response header."""
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        """The response headers (the live dict, as in TorchServe)."""
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        """One response header, or None."""
        return self._response_header.get(key)

    def get_request_properties(self) -> dict:
        """All request headers (the live dict, as in TorchServe)."""
        return self._request_header

    def __repr__(self) -> str:
        return (
            f"RequestProcessor(status={self._status_code}, phrase={self._reason_phrase!r}, "
            f"request_headers={sorted(self._request_header)}, "
            f"response_headers={self._response_header!r})"
        )


class ResponseInfo(NamedTuple):
    """What the handler set for one request: status code, reason phrase, response headers."""

    code: int
    phrase: str | None
    headers: dict[str, str]

    @property
    def content_type(self) -> str | None:
        """The ``content-type`` response header set with ``set_response_content_type``."""
        return self.headers.get("content-type")


def read_responses(context: Any) -> list[ResponseInfo]:
    """Read back, per request, the status and headers a handler set on any TorchServe-like context.

    Works on handlerkit's MockContext and on TorchServe's own ``ts.context.Context``.
    """
    processors = getattr(context, "request_processor", None) or []
    return [
        ResponseInfo(rp.get_response_status_code(), rp.get_response_status_phrase(), dict(rp.get_response_headers()))
        for rp in processors
    ]


def bind_requests(context: Any, request_ids: Mapping[int, str], headers: Sequence[dict]) -> Any:
    """Give a context a new batch of requests, the way ``ts.service.Service.predict`` does.

    Sets ``context.request_ids``, a fresh ``context.request_processor`` list (so statuses set
    during a previous call do not leak) and ``context.metrics.request_ids`` when the metrics
    object has that attribute. Works on handlerkit's MockContext and ``ts.context.Context``.

    Args:
        context: the context to update.
        request_ids: batch index → request id.
        headers: one header dict per request (each is copied).

    Returns:
        The context, for chaining.
    """
    if len(request_ids) != len(headers):
        raise ValueError(
            f"bind_requests needs one header dict per request id: got {len(request_ids)} "
            f"ids and {len(headers)} header dicts"
        )
    ids = dict(request_ids)
    context.request_ids = ids
    context.request_processor = [RequestProcessor(_copy_headers(h)) for h in headers]
    metrics = getattr(context, "metrics", None)
    if metrics is not None and hasattr(metrics, "request_ids"):
        metrics.request_ids = ids
    return context


def _copy_headers(headers: Mapping) -> dict:
    # Parameter entries are nested dicts ({"content-type": ...}); copy them too.
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in headers.items()}
