"""The two wire forms of a request: HTTP fields as TorchServe's frontend parses them, and the
OTF frame the frontend writes to the worker socket.

It also holds what the worker does with a parameter it reads off the socket (decoding).
Parameters are plain ``(name, value, content_type)`` triples here (``handlerkit.worker.requests.Parameter``
is one), so this module depends only on the base layer.
"""

from __future__ import annotations

import json
import mimetypes
import os
import re
import struct
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, unquote_plus, unquote_to_bytes

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
    """An ``application/x-www-form-urlencoded`` body split into fields as TorchServe 0.12's
    frontend splits it (``InferenceRequestHandler`` hands it to Netty 4.1.53's
    ``HttpPostStandardRequestDecoder``; ``NettyUtils.getFormData`` makes each field a parameter
    without a content type, so the worker hands the handler a ``bytearray``):

    - fields are separated by ``&``; ``+`` is a space and ``%XX`` a byte, in names and values;
    - a name is text (UTF-8, an invalid sequence becomes U+FFFD), stripped of whitespace at
      either end; a value stays the bytes it decodes to, whatever they are;
    - ``a&b=1`` gives ``a`` an empty value; a last field without ``=`` (``a=1&b``) is dropped,
      as is a trailing ``&``; a value ends at a line end (CRLF or LF), and what follows is ignored;
    - a repeated name is a parameter each time (the worker's dict keeps the last value).

    Raises:
        ValueError: a body the frontend cannot split (it answers 500 and the handler never sees
            it): a field without a name (``=x``, ``&a=1``, ``a=1&&b=2``), a ``%`` not followed by
            two hex digits, a CR not followed by LF in a value.
    """
    fields: list[Triple] = []
    pos, end = 0, len(data)
    while pos < end:
        stop = _first_of(data, b"=&", pos)
        if stop is None:
            break  # a name without "=" at the end of the body: Netty never completes that field
        name = _form_name(data[pos:stop], pos)
        if data[stop : stop + 1] == b"&":
            fields.append((name, b"", None))
            pos = stop + 1
            continue
        value_end = _first_of(data, b"&\r\n", stop + 1)
        if value_end is None:
            fields.append((name, _form_bytes(data[stop + 1 :], name), None))
            break
        fields.append((name, _form_bytes(data[stop + 1 : value_end], name), None))
        mark = data[value_end : value_end + 1]
        if mark == b"&":
            pos = value_end + 1
            continue
        if mark == b"\r" and data[value_end + 1 : value_end + 2] not in (b"\n", b""):
            raise _unsplittable(f"field {name!r} has a CR not followed by LF (Netty: 'Bad end of line')")
        break  # a line end ends the body
    return fields


#: What Netty strips from a field's name (Java's ``\\s`` at either end, and every LF).
_NAME_STRIP = re.compile(r"^[ \t\n\x0b\f\r]+|[ \t\n\x0b\f\r]+$|\n")


def _first_of(data: bytes, marks: bytes, start: int) -> int | None:
    found = [i for i in (data.find(bytes([m]), start) for m in marks) if i >= 0]
    return min(found) if found else None


def _unsplittable(what: str) -> ValueError:
    return ValueError(
        f"TorchServe's frontend cannot split this {FORM_URLENCODED} body: {what}; it answers 500 and "
        "the handler never sees the request"
    )


def _check_escapes(raw: bytes, what: str) -> None:
    at = raw.find(b"%")
    while at >= 0:
        digits = raw[at + 1 : at + 3]
        if len(digits) < 2 or not all(chr(d) in "0123456789abcdefABCDEF" for d in digits):
            raise _unsplittable(f"{what} {raw!r} has a '%' not followed by two hex digits")
        at = raw.find(b"%", at + 3)


def _form_name(raw: bytes, at: int) -> str:
    """A field's name: UTF-8 text, ``+`` and ``%XX`` decoded (``QueryStringDecoder.decodeComponent``),
    then tidied as Netty's ``AbstractHttpData`` names are: CR and tab become spaces, LF goes,
    whitespace at either end is stripped."""
    _check_escapes(raw, "the name")
    text = unquote_plus(raw.decode("utf-8", errors="replace"), errors="replace")
    name = _NAME_STRIP.sub("", text.replace("\r", " ").replace("\t", " "))
    if not name:
        raise _unsplittable(f"the field at byte {at} has no name (Netty: 'empty name')")
    return name


def _form_bytes(raw: bytes, name: str) -> bytes:
    """A field's value: the bytes ``+`` and ``%XX`` decode to (Netty decodes values byte-wise)."""
    _check_escapes(raw, f"the value of {name!r}")
    return unquote_to_bytes(raw.replace(b"+", b" "))


def form_pairs(fields: Any) -> list[tuple[Any, Any]]:
    """``Request.form``'s fields, a mapping or ``(name, value)`` pairs, as pairs."""
    if isinstance(fields, Mapping):
        return list(fields.items())
    if isinstance(fields, (str, bytes)) or not isinstance(fields, Iterable):
        raise TypeError(f"Request.form needs a mapping or a list of (name, value) pairs: got {type(fields).__name__}")
    pairs = list(fields)
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"Request.form needs (name, value) pairs: got {pair!r}")
    return pairs


def urlencoded_body(fields: Iterable[tuple[Any, Any]]) -> bytes:
    """The ``application/x-www-form-urlencoded`` body of ``(name, value)`` pairs, as ``curl -d``
    or ``requests.post(url, data=...)`` sends it: see ``Request.form`` for the values allowed."""
    parts = []
    for name, value in fields:
        if not isinstance(name, str) or not name:
            raise TypeError(f"form field names must be non-empty str: got {name!r}")
        if isinstance(value, tuple) and len(value) == 2 and value[1] is None:
            value = value[0]  # (value, None): a plain field, which every urlencoded field is
        if isinstance(value, str):
            raw = value.encode("utf-8")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            raw = bytes(value)
        else:
            kind = "a file" if isinstance(value, os.PathLike) else "a typed value" if isinstance(value, tuple) else None
            got = kind or type(value).__name__
            raise TypeError(
                f"form field {name!r}: an {FORM_URLENCODED} field is text or bytes, with no content type "
                f"(the worker sees '' and hands the handler a bytearray): got {got}; send files and typed "
                "fields as multipart/form-data (drop the Content-Type header)"
            )
        parts.append(f"{quote_plus(name)}={quote_plus(raw)}")
    return "&".join(parts).encode("ascii")


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
