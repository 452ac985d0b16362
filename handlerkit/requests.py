"""Requests as TorchServe's worker hands them to a handler, built without a server.

A :class:`Request` holds what the frontend sends the worker for one HTTP request: its
parameters (name, raw bytes, content type) and its headers. :func:`batch` groups requests
into a :class:`Batch`, whose :attr:`Batch.data` is exactly the ``data`` argument of
``handle(data, context)`` and whose :meth:`Batch.bind` sets up the context as the worker
does. The rules, from TorchServe 0.12 (the Java frontend, ``ts/protocol/otf_message_handler.py``
and ``ts/service.py``):

- A raw POST body is one parameter named ``"body"`` whose content type is the media type of
  the ``Content-Type`` header (``application/json; charset=utf-8`` → ``application/json``).
  An ``application/x-www-form-urlencoded`` body is split into its fields.
- Multipart form fields arrive under their own names. Plain (non-file) fields have no content
  type; file uploads carry the part's content type (``application/octet-stream`` if none).
- The worker decodes ``application/json`` with ``json.loads`` and ``text*`` as UTF-8 ``str``;
  everything else, and anything that fails to decode, stays a ``bytearray``. With
  ``TS_DECODE_INPUT_REQUEST`` set to anything but ``true``, everything stays a ``bytearray``.
- Each request's headers dict holds ``{param name: {"content-type": ...}}`` (``""`` when
  none) updated with the HTTP headers. Header names keep the case the client sent (the
  frontend copies Netty's HTTP/1.1 header entries as they are): ``"Content-Type"``, not
  ``"content-type"``.

To feed a handler something HTTP cannot carry (a tensor), pass a ready-made data dict:
:meth:`Request.from_data`, or a dict where a request is expected (``batch({"data": t})``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import mimetypes
import os
import struct
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple, overload
from urllib.parse import parse_qsl

from handlerkit._stack import user_stacklevel as _user_stacklevel
from handlerkit.context import bind_requests
from handlerkit.errors import HandlerkitWarning

__all__ = ["Batch", "Parameter", "Request", "batch", "decode_enabled"]

_FORM_URLENCODED = "application/x-www-form-urlencoded"
_OCTET_STREAM = "application/octet-stream"
# What a multipart request's Content-Type header looks like; the boundary is never used.
_MULTIPART = "multipart/form-data; boundary=handlerkit"


class Parameter(NamedTuple):
    """One input parameter of a request, as the frontend sends it to the worker.

    Attributes:
        name: ``"body"`` for a raw body, the field name for a form field.
        value: the raw bytes.
        content_type: the media type, or None (the worker then sees ``""``).
    """

    name: str
    value: bytes
    content_type: str | None = None


def decode_enabled() -> bool:
    """Whether the worker decodes inputs: ``TS_DECODE_INPUT_REQUEST`` unset or exactly ``"true"``."""
    flag = os.environ.get("TS_DECODE_INPUT_REQUEST")
    return flag is None or flag == "true"


def _media_type(content_type: str | None) -> str | None:
    # Netty's HttpUtil.getMimeType: the part before ";", trimmed.
    if content_type is None:
        return None
    return content_type.split(";", 1)[0].strip()


def _decode(param: Parameter, decode: bool, where: str) -> Any:
    """The value the worker hands the handler for one parameter (otf_message_handler rules)."""
    raw = param.value
    content_type = param.content_type or ""
    if decode and content_type == "application/json":
        try:
            return json.loads(raw.decode("utf-8"))
        except Exception as exc:  # the worker catches everything and forwards the bytes
            warnings.warn(
                f"handlerkit: {where} is declared application/json but is not valid JSON "
                f"({exc}); TorchServe forwards it as raw bytearray",
                HandlerkitWarning,
                stacklevel=_user_stacklevel(),
            )
    elif decode and content_type.startswith("text"):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            warnings.warn(
                f"handlerkit: {where} is declared {content_type} but is not UTF-8 ({exc}); "
                "TorchServe forwards it as raw bytearray",
                HandlerkitWarning,
                stacklevel=_user_stacklevel(),
            )
    return bytearray(raw)


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes: got {type(value).__name__}")


def _check_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (headers or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"headers are strings on the wire: got {key!r}: {value!r}"
                + (f"; pass {str(value)!r}" if isinstance(value, (bool, int, float)) else "")
            )
        out[key] = value
    return out


def _has_header(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name.lower() for k in headers)


def _describe_params(params: Iterable[Parameter]) -> str:
    return ", ".join(f"{p.name}: {p.content_type or 'no type'} {_size(len(p.value))}" for p in params)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} kB"
    return f"{n / (1024 * 1024):.1f} MB"


@dataclasses.dataclass(frozen=True, repr=False)
class Request:
    """One inference request as TorchServe's frontend hands it to the worker.

    Build one with :meth:`from_file`, :meth:`from_bytes`, :meth:`json`, :meth:`text` or
    :meth:`form`; add headers with :meth:`with_headers`. Requests are immutable.

    Typed body constructors also set the ``Content-Type`` request header (unless you pass
    one): a real client request carries it, and the frontend derives the body's content type
    from it. No other headers are added.

    :meth:`from_data` wraps a ready-made data dict (``{"data": tensor}``) that the handler
    gets as it is, skipping the wire; such a request can only be encoded when every value
    has an HTTP form.

    Attributes:
        parameters: the input parameters, in order.
        headers: the request-level HTTP headers (names case-sensitive, as sent).
        request_id: the request id (a fresh uuid4 string by default).
        delivered: for :meth:`from_data` requests, the dict delivered as it is; else None.
    """

    parameters: tuple[Parameter, ...]
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    request_id: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))
    delivered: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        params = []
        for p in self.parameters:
            if not isinstance(p, Parameter):
                p = Parameter(*p)
            if not isinstance(p.name, str) or not p.name:
                raise TypeError(f"a parameter name must be a non-empty str: got {p.name!r}")
            if p.content_type is not None and not isinstance(p.content_type, str):
                raise TypeError(
                    f"content type of {p.name!r} must be a str or None: got {p.content_type!r}"
                )
            value = _as_bytes(p.value, f"the value of {p.name!r}")
            params.append(Parameter(p.name, value, p.content_type))
        if not isinstance(self.request_id, str) or not self.request_id:
            raise TypeError(f"request_id must be a non-empty str: got {self.request_id!r}")
        object.__setattr__(self, "parameters", tuple(params))
        object.__setattr__(self, "headers", MappingProxyType(_check_headers(self.headers)))
        if self.delivered is not None:
            if not isinstance(self.delivered, Mapping) or not all(isinstance(k, str) for k in self.delivered):
                raise TypeError("delivered data must be a dict of parameter name (str) → value")
            object.__setattr__(self, "delivered", MappingProxyType(copy.deepcopy(dict(self.delivered))))

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray | memoryview,
        content_type: str | None = None,
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A request carrying ``data``.

        With ``name="body"`` (the default) it is a raw POST body: its content type is the
        media type of ``content_type``, which also becomes the ``Content-Type`` header, and an
        ``application/x-www-form-urlencoded`` body is split into fields as the frontend does.
        Any other ``name`` makes it a one-field multipart upload (see :meth:`form`).
        """
        data = _as_bytes(data, "data")
        if name != "body":
            field = (data, content_type or _OCTET_STREAM)
            return cls.form({name: field}, headers=headers, request_id=request_id)
        hdrs = _check_headers(headers)
        if content_type is not None and not _has_header(hdrs, "Content-Type"):
            hdrs = {"Content-Type": content_type, **hdrs}
        media = _media_type(content_type)
        if media == _FORM_URLENCODED:
            try:
                fields = parse_qsl(data.decode("utf-8"), keep_blank_values=True)
            except UnicodeDecodeError as exc:
                raise ValueError(f"an {_FORM_URLENCODED} body must be UTF-8: {exc}") from exc
            params = tuple(Parameter(k, v.encode("utf-8"), None) for k, v in fields)
        else:
            params = (Parameter("body", data, media),)
        return cls._make(params, hdrs, request_id)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        content_type: str | None = None,
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A request carrying a file's bytes; the content type is guessed from the extension.

        ``.png``/``.jpg`` → ``image/*`` → the handler gets a ``bytearray``; ``.json`` → parsed
        JSON; ``.txt`` → ``str``. Pass ``content_type`` to override the guess. Any ``name``
        but ``"body"`` makes it a multipart file upload under that name.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {str(path)!r}")
        if name != "body":
            field = path if content_type is None else (path, content_type)
            return cls.form({name: field}, headers=headers, request_id=request_id)
        if content_type is None:
            content_type = mimetypes.guess_type(path.name)[0]
        return cls.from_bytes(path.read_bytes(), content_type, name, headers, request_id)

    @classmethod
    def json(
        cls,
        obj: Any,
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A request carrying ``obj`` as ``application/json`` (the handler gets it parsed)."""
        payload = json.dumps(obj).encode("utf-8")
        return cls.from_bytes(payload, "application/json", name, headers, request_id)

    @classmethod
    def text(
        cls,
        s: str,
        content_type: str = "text/plain",
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A request carrying ``s`` as UTF-8 text (the handler gets a ``str``)."""
        if not isinstance(s, str):
            raise TypeError(f"Request.text needs a str: got {type(s).__name__}")
        return cls.from_bytes(s.encode("utf-8"), content_type, name, headers, request_id)

    @classmethod
    def form(
        cls,
        fields: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A multipart/form-data request; each field arrives under its own name.

        Field values, and what the frontend makes of each:

        - ``str``: a plain form field — no content type, so the handler gets a ``bytearray``
          of its UTF-8 bytes (not a ``str``!), as with ``curl -F data=hello``;
        - ``bytes``: a file upload without a content type → ``application/octet-stream``;
        - a path (``pathlib.Path`` or ``os.PathLike``): a file upload, content type guessed
          from the extension (``application/octet-stream`` when unknown), as curl does;
        - ``(value, content_type)``: the value (str, bytes or path) with that content type
          (``None`` for a plain field).
        """
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError("Request.form needs a non-empty mapping of field name → value")
        params = tuple(_form_field(name, value) for name, value in fields.items())
        hdrs = _check_headers(headers)
        if not _has_header(hdrs, "Content-Type"):
            hdrs = {"Content-Type": _MULTIPART, **hdrs}
        return cls._make(params, hdrs, request_id)

    @classmethod
    def from_data(
        cls,
        data: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A request whose handler input is ``data`` itself (copied), skipping the wire.

        For feeding a stage what it cannot get over HTTP (a tensor, a PIL image). The
        per-parameter content types in the headers are guessed from the values (bytes →
        ``application/octet-stream``, str → ``text/plain``, JSON types → ``application/json``,
        others ``""``). When every value has such a form, :attr:`parameters` holds it, so the
        request can still be encoded.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"Request.from_data needs a dict: got {type(data).__name__}")
        params, _ = _wire_form(data)
        rid = request_id if request_id is not None else str(uuid.uuid4())
        return cls(params or (), _check_headers(headers), rid, data)

    @classmethod
    def _make(
        cls, params: tuple[Parameter, ...], headers: dict[str, str], request_id: str | None
    ) -> Request:
        if request_id is None:
            return cls(params, headers)
        return cls(params, headers, request_id)

    # -- copies ----------------------------------------------------------------------------

    def with_headers(self, headers: Mapping[str, str] | None = None, /, **more: str) -> Request:
        """A copy with headers added or replaced, and a fresh request id.

        Keyword names are used as they are: ``req.with_headers(explain="True")`` sends the
        ``explain`` header TorchServe's explanations API adds. Names with dashes go in a dict.
        """
        merged = {**self.headers, **_check_headers(headers), **_check_headers(more)}
        return dataclasses.replace(self, headers=merged, request_id=str(uuid.uuid4()))

    # -- what the worker makes of it ---------------------------------------------------------

    def data(self, decode: bool | None = None) -> dict[str, Any]:
        """This request's entry in ``handle``'s ``data`` list (a fresh dict each call)."""
        return self._data(decode_enabled() if decode is None else decode, f"request {self.request_id}")

    def _data(self, decode: bool, label: str) -> dict[str, Any]:
        if self.delivered is not None:
            return copy.deepcopy(dict(self.delivered))
        return {p.name: _decode(p, decode, f"{label} parameter {p.name!r}") for p in self.parameters}

    def header_dict(self) -> dict[str, Any]:
        """This request's headers as the worker builds them (parameter entries, then HTTP headers)."""
        if self.delivered is not None:
            out: dict[str, Any] = {
                k: {"content-type": _content_type_of(v) or ""} for k, v in self.delivered.items()
            }
        else:
            out = {p.name: {"content-type": p.content_type or ""} for p in self.parameters}
        out.update(self.headers)
        return out

    def wire_problem(self) -> str | None:
        """Why this request cannot be encoded for the wire, or None when it can."""
        if self.delivered is None:
            return None
        return _wire_form(self.delivered)[1]

    @property
    def size(self) -> int:
        """Total bytes of all parameter values."""
        return sum(len(p.value) for p in self.parameters)

    def __repr__(self) -> str:
        if self.delivered is not None:
            body = "as-is " + (", ".join(f"{k}: {type(v).__name__}" for k, v in self.delivered.items()) or "{}")
        else:
            body = _describe_params(self.parameters)
        extra = [k for k in self.headers if k.lower() != "content-type"]
        hdrs = ", ".join(f"{k!r}: {self.headers[k]!r}" for k in extra)
        hdrs = f", headers={{{hdrs}}}" if extra else ""
        return f"Request({body}{hdrs}, id={self.request_id[:8]}…)"


def _form_field(name: Any, value: Any) -> Parameter:
    if not isinstance(name, str) or not name:
        raise TypeError(f"form field names must be non-empty str: got {name!r}")
    content_type: str | None
    if isinstance(value, tuple):
        if len(value) != 2:
            raise TypeError(
                f"form field {name!r}: a tuple must be (value, content_type): got {len(value)} items"
            )
        value, content_type = value
        explicit = True
    else:
        content_type, explicit = None, False
    if isinstance(value, str):
        data = value.encode("utf-8")  # a plain field: no content type unless given
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if not explicit:
            content_type = _OCTET_STREAM
    elif isinstance(value, os.PathLike):
        path = Path(value)
        data = path.read_bytes()
        if not explicit:
            content_type = mimetypes.guess_type(path.name)[0] or _OCTET_STREAM
    else:
        raise TypeError(
            f"form field {name!r}: a value must be str, bytes, a path or (value, content_type): "
            f"got {type(value).__name__}"
        )
    return Parameter(name, data, _media_type(content_type))


# ------------------------------------------------------------------------------------------
# Batches
# ------------------------------------------------------------------------------------------


def _content_type_of(value: Any) -> str | None:
    """The content type a data value would have been sent with, when it has one."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _OCTET_STREAM
    if isinstance(value, str):
        return "text/plain"
    if value is None or isinstance(value, (dict, list, bool, int, float)):
        return "application/json"
    return None


def _wire_form(data: Mapping[str, Any]) -> tuple[tuple[Parameter, ...] | None, str | None]:
    """The parameters that would deliver ``data``, or None and the reason there are none."""
    params = []
    for name, value in data.items():
        content_type = _content_type_of(value)
        if content_type == _OCTET_STREAM:
            raw = bytes(value)
        elif content_type == "text/plain":
            raw = value.encode("utf-8")
        else:
            try:
                raw = json.dumps(value).encode("utf-8") if content_type else b""
            except (TypeError, ValueError):
                content_type = None
            if content_type is None:
                return None, (
                    f"parameter {name!r} holds a {type(value).__name__}, which has no HTTP form; "
                    "build the request with Request.from_file/json/text/form to go on the wire"
                )
        params.append(Parameter(name, raw, content_type))
    return tuple(params), None


class Batch(Sequence[Request]):
    """A batch of requests: what one call of ``handle(data, context)`` gets.

    Build one with :func:`batch` (or :meth:`coerce`). ``data`` and ``headers`` are rebuilt on
    every access, so a handler that mutates its input (a ``bytearray``, a parsed dict) never
    changes the batch; keep the list in a variable if you need the same objects twice.

    Attributes:
        decode: whether values are decoded like the worker does (``TS_DECODE_INPUT_REQUEST``).
    """

    def __init__(
        self, items: Iterable[Request | Mapping[str, Any]], *, decode: bool | None = None
    ) -> None:
        requests: list[Request] = []
        for i, item in enumerate(items):
            if isinstance(item, Request):
                requests.append(item)
            elif isinstance(item, Mapping):
                requests.append(Request.from_data(item))
            else:
                hint = ""
                if isinstance(item, (list, tuple)):
                    hint = "; pass requests one by one: batch(*requests)"
                raise TypeError(
                    f"a batch holds handlerkit Requests or data dicts: item {i} is a "
                    f"{type(item).__name__}{hint}"
                )
        if not requests:
            raise ValueError("a batch needs at least one request (TorchServe never sends an empty one)")
        self._requests = tuple(requests)
        self.decode: bool = decode_enabled() if decode is None else bool(decode)

    @classmethod
    def coerce(cls, obj: Any, *, decode: bool | None = None) -> Batch:
        """A Batch from a Batch, a Request, or a list of Requests and/or data dicts.

        Data dicts (``[{"data": ...}]``) are delivered as they are (copied), with fresh
        request ids and per-parameter content-type headers guessed from the values
        (see :meth:`Request.from_data`).
        """
        if isinstance(obj, Batch):
            return obj
        if isinstance(obj, (Request, Mapping)):
            return cls([obj], decode=decode)
        if isinstance(obj, (list, tuple)):
            return cls(obj, decode=decode)
        raise TypeError(
            f"expected a Batch, a Request or a list of Requests / data dicts: got {type(obj).__name__}"
        )

    # -- what the handler gets -------------------------------------------------------------

    @property
    def data(self) -> list[dict[str, Any]]:
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
        bytearray}], "parameters": [{"name": str, "contentType": str, "value": decoded}]}``.

        Raises:
            TypeError: a data-dict request holding a value with no HTTP form.
        """
        out = []
        for i, req in enumerate(self._wire_requests()):
            out.append(
                {
                    "requestId": bytearray(req.request_id.encode("utf-8")),
                    "headers": [
                        {"name": bytearray(k.encode("utf-8")), "value": bytearray(v.encode("utf-8"))}
                        for k, v in req.headers.items()
                    ],
                    "parameters": [
                        {
                            "name": p.name,
                            "contentType": p.content_type or "",
                            "value": _decode(p, self.decode, f"request {i} parameter {p.name!r}"),
                        }
                        for p in req.parameters
                    ],
                }
            )
        return out

    def encode(self) -> bytes:
        """The inference message TorchServe's frontend writes to the worker socket (OTF protocol).

        ``ts.protocol.otf_message_handler.retrieve_msg`` reads it back. Decoding is the
        reader's business there (``TS_DECODE_INPUT_REQUEST`` at read time).

        Raises:
            TypeError: a data-dict request holding a value with no HTTP form.
        """
        out = bytearray(b"I")
        for req in self._wire_requests():
            _put(out, req.request_id.encode("utf-8"))
            for key, value in req.headers.items():
                _put(out, key.encode("utf-8"))
                _put(out, value.encode("utf-8"))
            out += struct.pack("!i", -1)
            for p in req.parameters:
                _put(out, p.name.encode("utf-8"))
                _put(out, (p.content_type or "").encode("utf-8"))
                _put(out, p.value)
            out += struct.pack("!i", -1)
        out += struct.pack("!i", -1)
        return bytes(out)

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


def _put(out: bytearray, data: bytes) -> None:
    out += struct.pack("!i", len(data))
    out += data


def batch(*requests: Request | Mapping[str, Any], decode: bool | None = None) -> Batch:
    """A batch of requests: ``batch(req1, req2).data`` is what ``handle`` receives.

    Args:
        *requests: handlerkit Requests (or raw data dicts, delivered as they are).
        decode: decode values like the worker (JSON → objects, text → str); None reads
            ``TS_DECODE_INPUT_REQUEST`` as the worker does (decoding unless it is set to
            anything but ``"true"``).
    """
    return Batch(requests, decode=decode)
