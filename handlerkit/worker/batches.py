"""Batches: what one call of ``handle(data, context)`` gets, and how the worker gets it.

:func:`batch` groups requests into a :class:`Batch`, whose :attr:`Batch.data` is exactly the
``data`` argument of ``handle(data, context)`` and whose :meth:`Batch.bind` sets up the context
as the worker does. :meth:`Batch.encode` is the frame TorchServe's frontend writes to the worker
socket, :meth:`Batch.to_worker_message` what the worker reads from it.

``data`` is a list, one item per request. The worker always builds request dicts; TorchServe's
own unit tests also call ``handle([[1.0, 2.0]], ctx)`` with plain items. A batch holds both:

- a :class:`~handlerkit.worker.requests.Request`, as it is;
- a dict keyed by parameter names (non-empty ``str``): a request delivering that dict
  (:meth:`Request.from_data`), whatever its values (``{"body": {"instances": [...]}}`` is what
  the worker builds for a JSON body);
- anything else (a list of floats, a str, bytes, a tensor, a dict with other keys such as
  ``{1: "x"}``): delivered as it is (:meth:`Request.from_item`), with a fresh request id and an
  empty header dict, because no frontend touched it.

:func:`payload` reads one row of ``data`` the one way every handlerkit handler reads it.
:func:`bind_implicitly` binds ``handle``'s own data when a test calls ``handle(data, ctx)``
directly on a context nobody bound a batch to, as TorchServe's unit tests do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from handlerkit.worker import _wire
from handlerkit.worker.context import bind_requests
from handlerkit.worker.requests import Request, decode_enabled

__all__ = ["Batch", "batch", "bind_implicitly", "payload"]


def payload(row: Any) -> Any:
    """A request's payload, read the one way every handlerkit handler reads it.

    TorchServe's handlers read ``row.get("data") or row.get("body")``; this gives the same
    value, with the empty case made explicit:

    1. ``row["data"]`` when it holds something: not None and not empty (``or`` skips None,
       ``b""``, ``""``, ``[]``, ``{}``, ``0``, ``False``; a tensor or an image always counts);
    2. else ``row["body"]`` when it is not None, empty or not;
    3. else the empty ``data`` value that was sent, where TorchServe's expression gives None;
    4. else None: neither key holds anything (a form whose fields have other names).

    An empty body therefore comes back as what the worker decoded: ``bytearray()`` (or ``""``
    for ``text/*``), never None, so a handler can say "empty body" apart from "no data/body".
    A row that is not a dict (a raw item, as in ``handle([[1.0, 2.0]], ctx)``) is its own
    payload and comes back unchanged.
    """
    if not isinstance(row, Mapping):
        return row
    data, body = row.get("data"), row.get("body")
    if not _skipped_by_or(data):
        return data
    if body is not None:
        return body
    return data


def _skipped_by_or(value: Any) -> bool:
    # What `x or y` skips, without asking a tensor or an array for its truth value.
    if value is None:
        return True
    if isinstance(value, (bytes, bytearray, memoryview, str, list, tuple, dict)):
        return len(value) == 0
    if isinstance(value, (bool, int, float)):
        return not value
    return False


def _as_request(index: int, item: Any) -> Request:
    if isinstance(item, Request):
        return item
    if isinstance(item, Mapping) and _request_dict(item):
        return Request.from_data(item)
    if isinstance(item, (list, tuple)) and any(isinstance(x, Request) for x in item):
        raise TypeError(
            f"item {index} is a {type(item).__name__} holding Requests; a batch holds requests "
            "one by one: batch(*requests) or Batch.coerce(requests)"
        )
    return Request.from_item(item)


def _not_a_batch(obj: Any) -> str:
    """Why ``obj`` is no batch, and the fix, for the TypeError."""
    expected = "expected a batch: a list as handle(data, context) takes it, a Batch or a Request"
    if obj is None:
        return f"{expected}: got None; pass a list of requests: [hk.Request.json(x)]"
    if isinstance(obj, str):
        return f"{expected}: got a str; pass a list: [x], or hk.batch(hk.Request.text(x))"
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return f"{expected}: got {type(obj).__name__}; pass a list: [x], or hk.batch(hk.Request.from_bytes(x))"
    if isinstance(obj, Mapping):
        return f"{expected}: got a dict of {len(obj)} Requests; pass them as a list: list(x.values())"
    return f"{expected}: got a {type(obj).__name__}; pass a list: [x] (each item goes to the handler as it is)"


def _request_dict(obj: Mapping[Any, Any]) -> bool:
    """Whether a dict is a request dict: keyed by parameter names (non-empty str), as the worker builds."""
    return all(isinstance(k, str) and k for k in obj)


def _dict_of_requests(obj: Mapping[Any, Any]) -> bool:
    # Only Requests make a dict a collection of requests: a request dict's values may be
    # dicts themselves (a parsed JSON body), so dict values prove nothing.
    return bool(obj) and all(isinstance(v, Request) for v in obj.values())


class Batch(Sequence[Request]):
    """A batch of requests: what one call of ``handle(data, context)`` gets.

    Build one with :func:`batch` (or :meth:`coerce`). ``data`` and ``headers`` are rebuilt on
    every access, so a handler that mutates its input (a ``bytearray``, a parsed dict) never
    changes the batch; keep the list in a variable if you need the same objects twice.

    Attributes:
        decode: whether values are decoded like the worker does (``TS_DECODE_INPUT_REQUEST``).
    """

    def __init__(self, items: Iterable[Any], *, decode: bool | None = None) -> None:
        requests = tuple(_as_request(i, item) for i, item in enumerate(items))
        if not requests:
            raise ValueError("a batch needs at least one request (TorchServe never sends an empty one)")
        self._requests = requests
        self.decode: bool = decode_enabled() if decode is None else bool(decode)

    @classmethod
    def coerce(cls, obj: Any, *, decode: bool | None = None) -> Batch:
        """A Batch from anything that stands for one: what ``handle``'s ``data`` may be.

        - a Batch (returned as it is) or a Request (a batch of one);
        - a list (or tuple), one request per item: Requests, data dicts delivered as they are
          (copied, fresh request ids, per-parameter content types guessed from the values), or
          any other item delivered as it is with no headers (see the module docstring);
        - one dict, a batch of one: a request dict (``{"data": ...}``, ``{"body": {...}}``)
          delivered as it is, or, with keys that are no parameter names (``{1: "x"}``), a raw
          item. Only a dict whose values are all Requests is taken for several requests, and
          refused.

        Raises:
            TypeError: ``obj`` is none of these (a tensor, a str, None, a dict of Requests): the
                message says what came and how to pass it.
        """
        if isinstance(obj, Batch):
            return obj
        if isinstance(obj, Request):
            return cls([obj], decode=decode)
        if isinstance(obj, (list, tuple)):
            return cls(obj, decode=decode)
        if isinstance(obj, Mapping) and not _dict_of_requests(obj):
            return cls([obj], decode=decode)
        raise TypeError(_not_a_batch(obj))

    # -- what the handler gets -------------------------------------------------------------

    @property
    def data(self) -> list[Any]:
        """Exactly what ``handle(data, context)`` receives (fresh objects on every access)."""
        return [r._data(self.decode, f"request {i}") for i, r in enumerate(self._requests)]

    @property
    def request_ids(self) -> dict[int, str]:
        """Batch index → request id (``context.request_ids``)."""
        return {i: r.request_id for i, r in enumerate(self._requests)}

    @property
    def headers(self) -> list[dict[str, Any]]:
        """Per request, the header dict TorchServe's worker builds (fresh on every access)."""
        return [r.header_dict() for r in self._requests]

    @property
    def requests(self) -> tuple[Request, ...]:
        """The requests, in batch order."""
        return self._requests

    def split(self) -> list[Batch]:
        """One single-request Batch per request (same ids and decoding)."""
        return [self[i : i + 1] for i in range(len(self))]

    def bind(self, context: Any) -> Any:
        """Set up ``context`` for this batch, as ``ts.service.Service.predict`` does.

        Sets ``context.request_ids``, a fresh ``context.request_processor`` (so statuses set
        during an earlier call do not leak) and ``context.metrics.request_ids``. Works on
        handlerkit's MockContext and on TorchServe's ``ts.context.Context``.

        Returns:
            The context.
        """
        return bind_requests(context, self.request_ids, self.headers)

    # -- the wire --------------------------------------------------------------------------

    def _wire_requests(self) -> tuple[Request, ...]:
        for i, r in enumerate(self._requests):
            problem = r.wire_problem()
            if problem:
                raise TypeError(f"request {i} cannot go on the wire: {problem}")
        return self._requests

    def to_worker_message(self) -> list[dict[str, Any]]:
        """The batch as the worker decodes it off the socket: ``ts.service.Service.predict``'s argument.

        Each request is ``{"requestId": bytearray, "headers": [{"name": bytearray, "value":
        bytearray}], "parameters": [{"name": str, "contentType": str, "value": decoded}]}``;
        the headers include those the frontend adds (:attr:`Request.frontend_headers`).

        Raises:
            TypeError: a request with no HTTP form (a raw item, a data dict holding a tensor).
        """
        return [
            {
                "requestId": bytearray(req.request_id.encode("utf-8")),
                "headers": [
                    {"name": bytearray(k.encode("utf-8")), "value": bytearray(v.encode("utf-8"))}
                    for k, v in req.worker_headers().items()
                ],
                "parameters": [
                    {
                        "name": p.name,
                        "contentType": p.content_type or "",
                        "value": p.decoded(self.decode, f"request {i} parameter {p.name!r}"),
                    }
                    for p in req.parameters
                ],
            }
            for i, req in enumerate(self._wire_requests())
        ]

    def encode(self) -> bytes:
        """The inference message TorchServe's frontend writes to the worker socket (OTF protocol).

        ``ts.protocol.otf_message_handler.retrieve_msg`` reads it back. Decoding is the
        reader's business there (``TS_DECODE_INPUT_REQUEST`` at read time).

        Raises:
            TypeError: a request with no HTTP form (a raw item, a data dict holding a tensor).
        """
        return _wire.encode_inference((r.request_id, r.worker_headers(), r.parameters) for r in self._wire_requests())

    # -- sequence --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._requests)

    @overload
    def __getitem__(self, index: int) -> Request: ...
    @overload
    def __getitem__(self, index: slice) -> Batch: ...
    def __getitem__(self, index: int | slice) -> Request | Batch:
        """A Request by index; a slice gives a Batch."""
        if isinstance(index, slice):
            return Batch(self._requests[index], decode=self.decode)
        return self._requests[index]

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    def __repr__(self) -> str:
        parts = []
        for r in self._requests[:4]:
            text = repr(r)
            parts.append(text[len("Request(") : text.rindex(", id=")])
        n = len(self._requests)
        more = f", … {n - 4} more" if n > 4 else ""
        shown = "; ".join(f"[{p}]" for p in parts)
        return f"Batch({n} request{'s' if n != 1 else ''}: {shown}{more}; decode={self.decode})"


def batch(*requests: Any, decode: bool | None = None) -> Batch:
    """A batch of requests: ``batch(req1, req2).data`` is what ``handle`` receives.

    Args:
        *requests: one argument per request: handlerkit Requests, data dicts keyed by
            parameter names (delivered as they are), or any other item, a dict with other keys
            included (``batch([1.0, 2.0])`` is ``handle([[1.0, 2.0]], ctx)``).
        decode: decode values like the worker (JSON → objects, text → str); None reads
            ``TS_DECODE_INPUT_REQUEST`` as the worker does (decoding unless it is set to
            anything but ``"true"``).

    Raises:
        TypeError: an argument is a list of requests or request dicts (pass them one by one,
            or use :meth:`Batch.coerce`); to deliver such a list as one item, wrap it in
            ``Request.from_item``.
    """
    for i, item in enumerate(requests):
        if isinstance(item, (list, tuple)) and item and all(isinstance(x, (Request, Mapping)) for x in item):
            raise TypeError(
                f"item {i} is a {type(item).__name__} of {len(item)} requests/dicts; pass requests "
                "one by one: batch(*requests), or Batch.coerce(requests); to deliver the list "
                "itself as one item: batch(Request.from_item(x))"
            )
    return Batch(requests, decode=decode)


class _DirectCallProcessors(list):
    """The request processors :func:`bind_implicitly` gives a context: the direct call's own
    batch, which the next direct call replaces (any other binding puts in a list of its own)."""


_NO_SLOT = object()


def bind_implicitly(context: Any, data: Any) -> bool:
    """Bind ``data`` to a context no batch is bound to, as TorchServe's worker would have.

    TorchServe's worker binds every batch to the context before ``handle``, so a context whose
    ``request_processor`` is None (``hk.MockContext``, or TorchServe's ``Context``, before any
    binding) means ``handle`` was called directly, as TorchServe's handler unit tests (and
    tests written like them) call it. handlerkit's ``BaseHandler.handle`` calls this first, so
    the statuses its handlers set per request (a bad image's 400) land in ``ctx.responses()``
    and its request-id checks see this call's batch. ``data`` is bound as :meth:`Batch.coerce`
    reads it (each request without headers of its own); the batch is the call's own, so the
    next direct call replaces it, and the context's ``implicit_batch`` says so.

    Left alone, returning False: a context a batch was bound to otherwise (``Batch.bind``, the
    Harness, the worker), a context with no request slots at all (TorchServe's test
    ``MockContext``: nothing to bind to), and ``data`` that is no batch (None, an empty list).
    """
    processors = getattr(context, "request_processor", _NO_SLOT)
    if processors is _NO_SLOT:
        return False
    if processors is not None and type(processors) is not _DirectCallProcessors:
        return False
    try:
        found = Batch.coerce(data)
    except (TypeError, ValueError):
        return False
    found.bind(context)
    context.request_processor = _DirectCallProcessors(context.request_processor)
    with contextlib.suppress(AttributeError):  # (a context with slots)
        context.implicit_batch = True  # after the line above: hk.MockContext's setter resets it
    return True
