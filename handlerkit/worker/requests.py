"""Requests as TorchServe's worker hands them to a handler, built without a server.

A :class:`Request` is one HTTP request as the frontend forwards it to the worker: parameters
(name, raw bytes, content type), the client's headers, and the headers the frontend adds.
Batches, and :func:`~handlerkit.worker.batches.payload` (a row's payload, read the one way handlerkit's
handlers read it), are :mod:`handlerkit.worker.batches`. TorchServe 0.12's rules:

- A raw body is one parameter ``"body"`` typed by the ``Content-Type`` header's media type, the
  part before ``;`` and not trimmed (``application/json; charset=utf-8`` → ``application/json``,
  but ``application/json ; charset=utf-8`` → ``"application/json "``, which the worker does not
  parse); an ``application/x-www-form-urlencoded`` body (any case) is split into fields, each
  untyped (the handler gets a ``bytearray``), a repeated name once per occurrence.
  Multipart fields arrive under their own names: plain fields untyped, file uploads with the
  part's type (``application/octet-stream`` if none).
- The worker decodes ``application/json`` with ``json.loads`` and ``text*`` as UTF-8 ``str``;
  anything else, or anything that fails to decode, stays a ``bytearray``. All stays a
  ``bytearray`` when ``TS_DECODE_INPUT_REQUEST`` is set to anything but ``true``.
- A request's header dict is ``{param name: {"content-type": ...}}`` (``""`` when untyped)
  updated with the request-level headers, names in the case the client sent (``"Content-Type"``).

**Headers the frontend adds** (``InferenceRequestHandler`` in 0.12's ``model-server.jar``;
lower-case names, string values, sent over the worker socket like any header):

- ``/predictions/<model>[/<version>[/<more>]]``: ``url_path`` = the path segments after the
  version joined by ``/`` (percent-decoded, no query, trailing ``/`` dropped; ``""`` when none:
  ``/predictions/m/1.0/v1/chat/`` → ``"v1/chat"``), and ``explain: "False"``.
- ``/explanations/...``: the same with ``explain: "True"``, the only difference.
- KServe ``/v1/models/<m>:predict``, ``/v2/models/<m>/infer``: ``explain: "False"`` (``"True"``
  for ``:explain``, ``/explain``), no ``url_path``.
- ``/invocations``, ``/models/<m>/invoke``, ``/<m>/predict``, gRPC ``Predictions``, KServe gRPC
  ``ModelInfer``, workflows: none. Not a prediction: ``GET /models/<m>?customized=true`` (gRPC
  ``DescribeModel``) sends the client's headers, ``describe: "True"`` and no parameters.

They come after the client's headers into a map, so a client's own ``explain``/``url_path``
(same case) is replaced; ``Explain`` stays a separate key. A handlerkit Request is a
``/predictions`` request: its worker view carries ``url_path`` (argument, ``""`` by default) and
``explain: "False"``, and headers you set win, so ``req.with_headers(explain="True")`` is the
request as ``/explanations`` delivers it.

What HTTP cannot carry (a tensor) goes in a data dict (:meth:`Request.from_data`) or as any
other item (:meth:`Request.from_item`, TorchServe's unit-test path ``handle([[1.0, 2.0]], ctx)``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import mimetypes
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from handlerkit._text import format_bytes
from handlerkit.worker import _wire
from handlerkit.worker._wire import decode_enabled

__all__ = ["Parameter", "Request", "decode_enabled"]


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

    def decoded(self, decode: bool | None = None, where: str | None = None) -> Any:
        """The value the worker hands the handler (JSON parsed, text as str, else bytearray).

        Args:
            decode: decode JSON and text; None reads ``TS_DECODE_INPUT_REQUEST`` as the worker does.
            where: how a warning about an undecodable value names this parameter.
        """
        decode = decode_enabled() if decode is None else decode
        return _wire.decode_value(self.value, self.content_type, decode, where or f"parameter {self.name!r}")


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes: got {type(value).__name__}")


def _check_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (headers or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            hint = f"; pass {str(value)!r}" if isinstance(value, (bool, int, float)) else ""
            raise TypeError(f"headers are strings on the wire: got {key!r}: {value!r}{hint}")
        out[key] = value
    return out


def _header_content_type(hdrs: Mapping[str, str]) -> str | None:
    """The ``Content-Type`` header's value, its name matched case-insensitively as HTTP does."""
    values = {v for k, v in hdrs.items() if k.lower() == "content-type"}
    if len(values) > 1:
        raise ValueError(
            f"the headers hold several Content-Type values {sorted(values)}; an HTTP request has one: keep one"
        )
    return next(iter(values), None)


def _body_headers(headers: Mapping[str, str] | None, content_type: str | None) -> tuple[dict[str, str], str | None]:
    """The headers and the body's content type: the argument, else the ``Content-Type`` header.

    The frontend types a raw body by its ``Content-Type`` header, so the two must agree: a
    ``content_type`` becomes that header when there is none, and one that names another media
    type than the header is a ValueError.
    """
    hdrs = _check_headers(headers)
    header = _header_content_type(hdrs)
    if content_type is None:
        return hdrs, header
    if header is None:
        return {"Content-Type": content_type, **hdrs}, content_type
    if _wire.media_type(header) != _wire.media_type(content_type):
        raise ValueError(
            f"content_type {content_type!r} and the Content-Type header {header!r} disagree; the "
            "frontend types the body by the header: pass one of them, or the same media type in both"
        )
    return hdrs, header


def _with_content_type(headers: Mapping[str, str] | None, content_type: str) -> dict[str, str]:
    hdrs = _check_headers(headers)
    if _header_content_type(hdrs) is not None:
        return hdrs
    return {"Content-Type": content_type, **hdrs}


def _copied(value: Any) -> Any:
    """A deep copy where one can be made (a handler may mutate its input), else the value."""
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


@dataclasses.dataclass(frozen=True, repr=False)
class Request:
    """One inference request as TorchServe's frontend hands it to the worker.

    Build one with :meth:`from_file`, :meth:`from_bytes`, :meth:`json`, :meth:`text` or
    :meth:`form`; change one with :meth:`with_headers` and :meth:`with_url_path`. Requests are
    immutable. Typed body constructors also set the ``Content-Type`` header (unless you pass
    one): the frontend derives the body's content type from it.

    Every request is a ``/predictions`` request: the worker also sees the headers the
    frontend adds (:attr:`frontend_headers`, see the module docstring), unless you set them.
    :meth:`from_data` wraps a ready-made data dict (``{"data": tensor}``) delivered as it is;
    :meth:`from_item` any other item, with no headers at all.

    Attributes:
        parameters: the input parameters, in order.
        headers: the headers the client sent or you set (names case-sensitive).
        request_id: the request id (a fresh uuid4 string by default).
        delivered: what :meth:`from_data` / :meth:`from_item` deliver as it is; else None.
        url_path: the URL path after ``/predictions/<model>/<version>/``.
        item: True for a :meth:`from_item` request.
    """

    parameters: tuple[Parameter, ...]
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    request_id: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))
    delivered: Any = dataclasses.field(default=None, compare=False, hash=False)
    url_path: str = ""
    item: bool = False

    def __post_init__(self) -> None:
        params = []
        for p in self.parameters:
            name, value, content_type = p if isinstance(p, Parameter) else Parameter(*p)
            if not isinstance(name, str) or not name:
                raise TypeError(f"a parameter name must be a non-empty str: got {name!r}")
            if content_type is not None and not isinstance(content_type, str):
                raise TypeError(f"content type of {name!r} must be a str or None: got {content_type!r}")
            params.append(Parameter(name, _as_bytes(value, f"the value of {name!r}"), content_type))
        if not isinstance(self.request_id, str) or not self.request_id:
            raise TypeError(f"request_id must be a non-empty str: got {self.request_id!r}")
        if not isinstance(self.url_path, str):
            raise TypeError(f"url_path is a str (the URL path after the version): got {self.url_path!r}")
        if self.item and self.url_path:
            raise ValueError("a raw item never came through the frontend: it has no url_path")
        # The frontend splits the URL path on "/" with Java's String.split, which drops the
        # trailing empty segments: "v1/chat/" arrives as "v1/chat".
        object.__setattr__(self, "url_path", self.url_path.rstrip("/"))
        object.__setattr__(self, "parameters", tuple(params))
        object.__setattr__(self, "headers", MappingProxyType(_check_headers(self.headers)))
        if self.item:
            object.__setattr__(self, "delivered", _copied(self.delivered))
        elif self.delivered is not None:
            if not isinstance(self.delivered, Mapping) or not all(isinstance(k, str) for k in self.delivered):
                raise TypeError("delivered data must be a dict of parameter name (str) → value")
            object.__setattr__(self, "delivered", MappingProxyType(_copied(dict(self.delivered))))

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray | memoryview,
        content_type: str | None = None,
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        *,
        url_path: str = "",
    ) -> Request:
        """A request carrying ``data``.

        With ``name="body"`` (the default) it is a raw POST body, typed as the frontend types
        it: by the media type of the ``Content-Type`` header (the part before ``;``, untrimmed,
        as Netty's ``HttpUtil.getMimeType``). ``content_type`` becomes that header when
        ``headers`` has none; without ``content_type`` the header (any case of its name) is
        used. An ``application/x-www-form-urlencoded`` body (any case) is split into fields as
        the frontend does. Any other ``name`` makes it a one-field multipart upload (see
        :meth:`form`). ``url_path`` is what followed ``/predictions/<model>/<version>/`` in the
        URL (a trailing ``/`` is dropped, as the frontend does).

        Raises:
            ValueError: ``content_type`` and a ``Content-Type`` header name different media types.
        """
        data = _as_bytes(data, "data")
        if name != "body":
            field = (data, content_type or _wire.OCTET_STREAM)
            return cls.form({name: field}, headers=headers, request_id=request_id, url_path=url_path)
        hdrs, content_type = _body_headers(headers, content_type)
        media = _wire.media_type(content_type)
        if _wire.is_urlencoded(media):
            params = tuple(Parameter(*f) for f in _wire.urlencoded_fields(data))
        else:
            params = (Parameter("body", data, media),)
        return cls._make(params, hdrs, request_id, url_path)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        content_type: str | None = None,
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        *,
        url_path: str = "",
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
            return cls.form({name: field}, headers=headers, request_id=request_id, url_path=url_path)
        if content_type is None:
            content_type = mimetypes.guess_type(path.name)[0]
        return cls.from_bytes(path.read_bytes(), content_type, name, headers, request_id, url_path=url_path)

    @classmethod
    def json(
        cls,
        obj: Any,
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        *,
        url_path: str = "",
    ) -> Request:
        """A request carrying ``obj`` as ``application/json`` (the handler gets it parsed)."""
        body = json.dumps(obj).encode("utf-8")
        return cls.from_bytes(body, "application/json", name, headers, request_id, url_path=url_path)

    @classmethod
    def text(
        cls,
        s: str,
        content_type: str | None = None,
        name: str = "body",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        *,
        url_path: str = "",
    ) -> Request:
        """A request carrying ``s`` as UTF-8 text (the handler gets a ``str`` for a ``text/*`` type).

        The content type is ``content_type``, else a ``Content-Type`` header in ``headers``,
        else ``text/plain``.
        """
        if not isinstance(s, str):
            raise TypeError(f"Request.text needs a str: got {type(s).__name__}")
        if content_type is None and (name != "body" or _header_content_type(_check_headers(headers)) is None):
            content_type = "text/plain"
        return cls.from_bytes(s.encode("utf-8"), content_type, name, headers, request_id, url_path=url_path)

    @classmethod
    def form(
        cls,
        fields: Mapping[str, Any] | Iterable[tuple[str, Any]],
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        *,
        url_path: str = "",
    ) -> Request:
        """A form request; each field arrives under its own name.

        ``fields`` is a mapping of field name → value, or a list of ``(name, value)`` pairs (a
        name given twice arrives twice, as two parameters; the worker's dict keeps the last).

        By default the request is ``multipart/form-data`` (``curl -F``, ``requests.post(url,
        files=...)``). Field values, and what the frontend makes of each:

        - ``str``: a plain form field — no content type, so the handler gets a ``bytearray``
          of its UTF-8 bytes (not a ``str``!), as with ``curl -F data=hello``;
        - ``bytes``: a file upload without a content type → ``application/octet-stream``;
        - a path (``pathlib.Path`` or ``os.PathLike``): a file upload, content type guessed
          from the extension (``application/octet-stream`` when unknown), as curl does;
        - ``(value, content_type)``: the value (str, bytes or path) with that content type
          (``None`` for a plain field).

        With a ``Content-Type: application/x-www-form-urlencoded`` header it is an urlencoded
        body instead (``curl -d``, ``requests.post(url, data={...})``, mlflow-torchserve's
        plugin), which TorchServe's frontend splits into the same fields: every value ``str`` or
        ``bytes`` (or ``(value, None)``), none with a content type, so the handler gets each as
        a ``bytearray`` of its bytes (see :func:`handlerkit.worker._wire.urlencoded_fields` for the
        frontend's rules).

        Raises:
            ValueError: no fields, or a Content-Type header that is neither of the two.
            TypeError: a value of another kind (a file or a content type in an urlencoded form).
        """
        pairs = _wire.form_pairs(fields)
        if not pairs:
            raise ValueError("Request.form needs a non-empty mapping of field name → value (or a list of pairs)")
        hdrs = _with_content_type(headers, _wire.MULTIPART)
        header = _header_content_type(hdrs)
        if _wire.is_multipart(header):
            params = tuple(Parameter(*_wire.form_field(name, value)) for name, value in pairs)
        elif _wire.is_urlencoded(_wire.media_type(header)):
            # The body a client sends, split as the frontend splits it: what the handler gets.
            params = tuple(Parameter(*f) for f in _wire.urlencoded_fields(_wire.urlencoded_body(pairs)))
        else:
            raise ValueError(
                f"Request.form sends multipart/form-data or {_wire.FORM_URLENCODED}, but the Content-Type "
                f"header is {header!r}: the frontend would read the body as one raw parameter; drop the "
                "header, or build the request with Request.from_bytes"
            )
        return cls._make(params, hdrs, request_id, url_path)

    @classmethod
    def from_data(
        cls,
        data: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        *,
        url_path: str = "",
    ) -> Request:
        """A request whose handler input is ``data`` itself (copied), skipping the wire.

        For feeding a stage what it cannot get over HTTP (a tensor, a PIL image). The
        per-parameter content types in the headers are guessed from the values (bytes →
        ``application/octet-stream``, str → ``text/plain``, JSON types → ``application/json``,
        others ``""``). When every value has such a form, :attr:`parameters` holds it, so the
        request can still be encoded.
        """
        if not isinstance(data, Mapping):
            raise TypeError(
                f"Request.from_data needs a dict: got {type(data).__name__}; "
                "deliver any other object as it is with Request.from_item(x)"
            )
        for key in data:
            if not isinstance(key, str) or not key:
                raise TypeError(
                    f"Request.from_data needs parameter names (non-empty str) as keys: got {key!r}; "
                    "deliver a dict with other keys as it is with Request.from_item(x)"
                )
        params, _ = _wire.wire_form(data)
        rid = request_id if request_id is not None else str(uuid.uuid4())
        return cls(tuple(Parameter(*p) for p in params or ()), _check_headers(headers), rid, data, url_path)

    @classmethod
    def from_item(cls, item: Any, request_id: str | None = None) -> Request:
        """One item of ``handle``'s data list delivered as it is: TorchServe's unit-test path.

        TorchServe's own tests call ``handler.handle([[1.0, 2.0]], ctx)``: each item of ``data``
        is a request. The worker never builds such an item (it always delivers request dicts),
        so it has no headers: the frontend added none, and ``context.get_request_header(i, ...)``
        finds nothing. The item is deep-copied where possible, and again on every delivery.
        """
        if isinstance(item, Request):
            raise TypeError("Request.from_item got a Request: use it as it is")
        rid = request_id if request_id is not None else str(uuid.uuid4())
        return cls((), {}, rid, item, item=True)

    @classmethod
    def _make(
        cls, params: tuple[Parameter, ...], headers: dict[str, str], request_id: str | None, url_path: str
    ) -> Request:
        if request_id is None:
            return cls(params, headers, url_path=url_path)
        return cls(params, headers, request_id, url_path=url_path)

    # -- copies ----------------------------------------------------------------------------

    def with_headers(self, headers: Mapping[str, str] | None = None, /, **more: str) -> Request:
        """A copy with headers added or replaced, and a fresh request id.

        Keyword names are used as they are: ``req.with_headers(explain="True")`` is the request
        as TorchServe's explanations API delivers it. Names with dashes go in a dict.
        """
        merged = {**self.headers, **_check_headers(headers), **_check_headers(more)}
        return dataclasses.replace(self, headers=merged, request_id=str(uuid.uuid4()))

    def with_url_path(self, path: str) -> Request:
        """A copy sent to ``/predictions/<model>/<version>/<path>``, with a fresh request id."""
        return dataclasses.replace(self, url_path=path, request_id=str(uuid.uuid4()))

    # -- what the worker makes of it ---------------------------------------------------------

    def data(self, decode: bool | None = None) -> Any:
        """This request's entry in ``handle``'s ``data`` list (a fresh object each call)."""
        return self._data(decode_enabled() if decode is None else decode, f"request {self.request_id}")

    def _data(self, decode: bool, label: str) -> Any:
        if self.item:
            return _copied(self.delivered)
        if self.delivered is not None:
            return _copied(dict(self.delivered))
        return {p.name: p.decoded(decode, f"{label} parameter {p.name!r}") for p in self.parameters}

    @property
    def frontend_headers(self) -> dict[str, str]:
        """The headers TorchServe's frontend adds for ``/predictions`` (none for an item)."""
        return {} if self.item else {"url_path": self.url_path, "explain": "False"}

    def worker_headers(self) -> dict[str, str]:
        """The request-level headers the worker receives: the frontend's, then yours over them."""
        return {**self.frontend_headers, **self.headers}

    def header_dict(self) -> dict[str, Any]:
        """This request's headers as the worker builds them (parameter entries, then headers)."""
        if self.item:
            return dict(self.headers)
        if self.delivered is not None:
            types = {k: _wire.content_type_of(v) for k, v in self.delivered.items()}
        else:
            types = {p.name: p.content_type for p in self.parameters}
        out: dict[str, Any] = {name: {"content-type": t or ""} for name, t in types.items()}
        out.update(self.worker_headers())
        return out

    def wire_problem(self) -> str | None:
        """Why this request cannot be encoded for the wire, or None when it can."""
        if self.item:
            return (
                f"it is a raw {type(self.delivered).__name__} item (the unit-test path); TorchServe's "
                "worker only delivers request dicts: build it with Request.json/from_file/text/form"
            )
        if self.delivered is None:
            return None
        return _wire.wire_form(self.delivered)[1]

    @property
    def size(self) -> int:
        """Total bytes of all parameter values."""
        return sum(len(p.value) for p in self.parameters)

    def __repr__(self) -> str:
        if self.item:
            body = f"item {type(self.delivered).__name__}"
        elif self.delivered is not None:
            body = "as-is " + (", ".join(f"{k}: {type(v).__name__}" for k, v in self.delivered.items()) or "{}")
        else:
            body = ", ".join(
                f"{p.name}: {p.content_type or 'no type'} {format_bytes(len(p.value))}" for p in self.parameters
            )
        extra = [k for k in self.headers if k.lower() != "content-type"]
        hdrs = ", ".join(f"{k!r}: {self.headers[k]!r}" for k in extra)
        hdrs = f", headers={{{hdrs}}}" if extra else ""
        path = f", url_path={self.url_path!r}" if self.url_path else ""
        return f"Request({body}{hdrs}{path}, id={self.request_id[:8]}…)"
