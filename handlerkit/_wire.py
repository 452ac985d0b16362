"""The two wire forms of a request: HTTP fields as TorchServe's frontend parses them, and the
OTF frame the frontend writes to the worker socket.

It also holds what the worker does with a parameter it reads off the socket (decoding).
Parameters are plain ``(name, value, content_type)`` triples here (``handlerkit.requests.Parameter``
is one), so this module depends only on the base layer.
"""

from __future__ import annotations

import json
import mimetypes
import os
import struct
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitWarning

FORM_URLENCODED = "application/x-www-form-urlencoded"
OCTET_STREAM = "application/octet-stream"
#: What a multipart request's Content-Type header looks like; the boundary is never used.
MULTIPART = "multipart/form-data; boundary=handlerkit"

Triple = tuple[str, bytes, "str | None"]


def media_type(content_type: str | None) -> str | None:
    """Netty's ``HttpUtil.getMimeType``: the part before ``;``, *not* trimmed.

    Only the header value's own ends are trimmed (Netty's HTTP decoder does that), so
    ``"application/json ; charset=utf-8"`` gives ``"application/json "``, which the worker does
    not take for JSON (it compares with ``==``): such a body stays a ``bytearray``.
    """
    if content_type is None:
        return None
    return content_type.strip(" \t").split(";", 1)[0]


def is_urlencoded(media: str | None) -> bool:
    """Whether the frontend splits the body into form fields (compared ignoring case, as Netty does)."""
    return media is not None and media.lower() == FORM_URLENCODED


def is_multipart(content_type: str | None) -> bool:
    """Netty's ``HttpPostRequestDecoder.isMultipart``: ``multipart/form-data`` with a boundary."""
    return (
        content_type is not None
        and content_type.startswith("multipart/form-data")
        and "boundary=" in content_type.lower()
    )


def _part_type(content_type: str | None) -> str | None:
    # A multipart part's Content-Type is split on ";" and trimmed by Netty's multipart decoder.
    return None if content_type is None else content_type.split(";", 1)[0].strip()


def urlencoded_fields(data: bytes) -> list[Triple]:
    """An ``application/x-www-form-urlencoded`` body split into fields (no content types)."""
    try:
        fields = parse_qsl(data.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError as exc:
        raise ValueError(f"an {FORM_URLENCODED} body must be UTF-8: {exc}") from exc
    return [(k, v.encode("utf-8"), None) for k, v in fields]


def form_field(name: Any, value: Any) -> Triple:
    """One multipart field: see ``Request.form`` for what each kind of value becomes."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"form field names must be non-empty str: got {name!r}")
    content_type: str | None
    if isinstance(value, tuple):
        if len(value) != 2:
            raise TypeError(f"form field {name!r}: a tuple must be (value, content_type): got {len(value)} items")
        value, content_type = value
        explicit = True
    else:
        content_type, explicit = None, False
    if isinstance(value, str):
        data = value.encode("utf-8")  # a plain field: no content type unless given
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if not explicit:
            content_type = OCTET_STREAM
    elif isinstance(value, os.PathLike):
        path = Path(value)
        data = path.read_bytes()
        if not explicit:
            content_type = mimetypes.guess_type(path.name)[0] or OCTET_STREAM
    else:
        raise TypeError(
            f"form field {name!r}: a value must be str, bytes, a path or (value, content_type): "
            f"got {type(value).__name__}"
        )
    return (name, data, _part_type(content_type))


def content_type_of(value: Any) -> str | None:
    """The content type a decoded value would have been sent with, when it has one."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return OCTET_STREAM
    if isinstance(value, str):
        return "text/plain"
    if value is None or isinstance(value, (dict, list, bool, int, float)):
        return "application/json"
    return None


def wire_form(data: Mapping[str, Any]) -> tuple[list[Triple] | None, str | None]:
    """The parameters that would deliver ``data``, or None and the reason there are none."""
    params: list[Triple] = []
    for name, value in data.items():
        content_type = content_type_of(value)
        if content_type == OCTET_STREAM:
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
        params.append((name, raw, content_type))
    return params, None


def encode_inference(requests: Iterable[tuple[str, Mapping[str, str], Iterable[Triple]]]) -> bytes:
    """The inference frame (command ``I``) the frontend's ``ModelRequestEncoder`` writes.

    Per request: its id, ``name, value`` header pairs ended by -1, ``name, content type, value``
    parameters ended by -1; a final -1 ends the batch. Every field is a 4-byte big-endian length
    and the bytes (strings UTF-8). ``ts.protocol.otf_message_handler.retrieve_msg`` reads it.
    """
    out = bytearray(b"I")
    for request_id, headers, params in requests:
        _put(out, request_id.encode("utf-8"))
        for key, value in headers.items():
            _put(out, key.encode("utf-8"))
            _put(out, value.encode("utf-8"))
        out += struct.pack("!i", -1)
        for name, payload, content_type in params:
            _put(out, name.encode("utf-8"))
            _put(out, (content_type or "").encode("utf-8"))
            _put(out, payload)
        out += struct.pack("!i", -1)
    out += struct.pack("!i", -1)
    return bytes(out)


def _put(out: bytearray, data: bytes) -> None:
    out += struct.pack("!i", len(data))
    out += data


def decode_enabled() -> bool:
    """Whether the worker decodes inputs: ``TS_DECODE_INPUT_REQUEST`` unset or exactly ``"true"``."""
    flag = os.environ.get("TS_DECODE_INPUT_REQUEST")
    return flag is None or flag == "true"


def decode_value(value: bytes, content_type: str | None, decode: bool, where: str) -> Any:
    """What the worker's ``otf_message_handler`` makes of a parameter it read off the socket.

    ``application/json`` → ``json.loads``, ``text*`` → UTF-8 ``str``, anything else, and
    anything that fails to decode (with a warning naming ``where``), → ``bytearray``.
    """
    content_type = content_type or ""
    if decode and content_type == "application/json":
        try:
            return json.loads(value.decode("utf-8"))
        except Exception as exc:  # the worker catches everything and forwards the bytes
            problem = f"is declared application/json but is not valid JSON ({exc})"
    elif decode and content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = f"is declared {content_type} but is not UTF-8 ({exc})"
    else:
        return bytearray(value)
    warnings.warn(
        f"handlerkit: {where} {problem}; TorchServe forwards it as raw bytearray",
        HandlerkitWarning,
        stacklevel=user_stacklevel(),
    )
    return bytearray(value)
