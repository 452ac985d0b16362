"""The fix of a stage's failure, told apart by what the client sent.

handlerkit's own errors carry their fix (``error.fix``). For everything else a short table
matches the usual ways a stage fails (a foreign library's message is the only thing to go on
there), and fixes read off the batch tell the input from the code: a key the client's payload
lacks, an index out of an embedding's range, bytes that do not decode, a request that fails
alone where another passes, requests that fail only together. A fix that blames what a client
sent says to refuse that request alone (:data:`REFUSE_ALONE`), so the others are answered.
:mod:`handlerkit.recording.failures` puts the fix in the StageError.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from handlerkit._text import suggestion
from handlerkit.formats import STATE_DICT_FIX
from handlerkit.recording.alone import Alone
from handlerkit.worker.batches import payload
from handlerkit.worker.locations import Location, named

__all__ = ["REFUSE_ALONE", "input_fix", "missing_key_fix", "payload_fix", "suggest_fix", "together_fix"]

#: How a fix tells a handler to answer one request of a batch with its own 4xx while the
#: others are answered (handlerkit's per-request refusal); every fix that advises it says so
#: in these words, so the name is changed here only.
REFUSE_ALONE = (
    "refuse that request alone (self.refuse(index, message, fix=...), see handlerkit.handlers.PerRequestErrors)"
)

#: What a model says when a tensor's shape does not fit it (an entry of :data:`_FIXES`).
_SHAPE = ("mat1 and mat2 shapes cannot be multiplied", "size mismatch", "shape '[", "Given groups", "expected input")

# (substrings of "ExceptionType: message", fix, the stages it applies to or None for all)
_FIXES: list[tuple[tuple[str, ...], str, tuple[str, ...] | None]] = [
    (
        ("DecompressionBombError",),
        "send a smaller image, or MockContext(limit_max_image_pixels=False) for trusted sources",
        None,
    ),
    (
        ("UnidentifiedImageError", "cannot identify image file"),
        "the request body is not an image: send PNG/JPEG bytes as the body or the 'data' field",
        None,
    ),
    (
        ("image file is truncated", "broken data stream", "Truncated"),
        "the image is truncated or corrupt: re-send the complete file",
        None,
    ),
    (
        ("UnicodeDecodeError",),
        "the body is not UTF-8: send text with content-type text/plain; charset=utf-8, or decode with errors='replace'",
        None,
    ),
    (
        ("Expected all tensors to be on the same device", "device type"),
        "move the input to self.device in preprocess (or the model in initialize)",
        None,
    ),
    # Before the shape entry: torch's load_state_dict says "size mismatch" too. handlerkit's
    # BaseHandler raises a ModelLoadError with this fix; TorchServe's lets torch's error through.
    (("Error(s) in loading state_dict",), STATE_DICT_FIX, None),
    (
        _SHAPE,
        "the preprocessed tensor's shape does not fit the model: compare h.results['preprocess'].tensors with the model's expected input",
        None,
    ),
    (
        ("NoneType' object is not callable", "'NoneType' object has no attribute"),
        "the model or a field is None: did initialize run and succeed? run h.initialize() first",
        None,
    ),
    (  # without the batch to look at (missing_key_fix says which of the two it is)
        ("KeyError",),
        "a dict lacks the key the handler reads: a field of the client's JSON, or a parameter of the request "
        "(TorchServe puts a raw body under 'body' and form fields under their names, such as 'data')",
        ("preprocess", "handle"),
    ),
    (
        ("stack expects each tensor to be equal size",),
        "preprocess must give every request the same shape: resize or pad in image_processing",
        None,
    ),
    (("out of memory", "MemoryError"), "lower the batch size or the input size (TorchServe answers 507)", None),
]


def suggest_fix(stage: str, exc: BaseException) -> str | None:
    """The fix for an exception raised in ``stage``: its own ``fix`` when it carries one, else
    a fix for the usual ways a stage fails, else None."""
    own = getattr(exc, "fix", None)
    if isinstance(own, str) and own:
        return own
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        own = getattr(cause, "fix", None)
        if isinstance(own, str) and own:
            return own
        text += f" {type(cause).__name__}: {cause}"
    for needles, fix, stages in _FIXES:
        if (stages is None or stage in stages) and any(n in text for n in needles):
            return fix
    if stage == "initialize":
        return "check the model dir, manifest and model-config.yaml the context points at"
    return None


def missing_key_fix(
    exc: BaseException, rows: list[Any], index: int | None, names: Mapping[int, str] | None = None
) -> str | None:
    """The fix for a ``KeyError`` raised reading the requests ``rows`` (``handle``'s data), told
    apart by what the request at fault (``index``, else the first that fits) holds:

    - its payload (the client's JSON object, or a list of them) lacks the key: the client's
      payload is at fault, not TorchServe's layout;
    - the request is a form of named fields (any besides ``'data'`` and ``'body'``) without
      that one: the client left the field out;
    - the request lacks a parameter of that name: TorchServe's layout (a raw body is under
      ``'body'``, form fields under their names) is what the handler misread.

    ``names`` calls requests by their index in ``rows`` (a file name), else ``request <index>``.
    ``""`` when the key is neither (a dict of the handler's own: a label map looked up with a
    class index or with a value the client sent), None for a key that is no field name."""
    key = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
    if not isinstance(key, str) or len(key.split()) != 1:  # a sentence (a KeyError used for a message)
        return None
    for i in [index] if index is not None else range(len(rows)):
        row = rows[i] if 0 <= i < len(rows) else None
        if not isinstance(row, Mapping) or key in row:
            continue
        who = (names or {}).get(i) or f"request {i}"
        body = payload(row)
        objects = [o for o in (body if isinstance(body, list) else [body]) if isinstance(o, Mapping)]
        if any(key == value for o in objects for value in o.values() if isinstance(value, str)):
            return ""  # a value the client sent, looked up in a dict of the handler's
        lacking = next((o for o in objects if key not in o), None)
        if lacking is not None and key not in ("data", "body"):  # those two are TorchServe's names
            keys = ", ".join(repr(k) for k in list(lacking)[:8]) or "no keys"
            return (
                f"the client's payload lacks the key {key!r}{suggestion(key, map(str, lacking))}: {who} sent "
                f"a JSON object with {keys}. Send {key!r} in the request, or validate it in preprocess and "
                f"{REFUSE_ALONE}, so the client gets a 400 that says what to send"
            )
        if key.isdigit():  # a class index, not a parameter's name
            return ""
        fields = [str(k) for k in row if k not in ("data", "body")]
        if fields and key not in ("data", "body"):  # a form of named fields: the client left one out
            return (
                f"the client's form lacks the field {key!r}{suggestion(key, fields)}: {who} sent the fields "
                f"{', '.join(repr(k) for k in row)}. Send {key!r} as a form field, or validate it in preprocess "
                f"and {REFUSE_ALONE}, so the client gets a 400 that says what to send"
            )
        return (
            f"{who} has no parameter {key!r} (it has {', '.join(repr(k) for k in row)}): TorchServe puts "
            "a raw body under 'body' and form fields under their names; read the payload with "
            "row.get('data') or row.get('body')"
        )
    return "" if rows else None


def payload_fix(who: str, other: str, stage: str, location: Location | None, shape: bool) -> str:
    """The fix for a request that fails ``stage`` alone where another passes: what it sent (a
    value of the wrong type, a malformed field, a ``shape`` the model refuses) is at fault."""
    what = "gives a shape the model refuses" if shape else "is what the handler cannot read"
    where = f", or correct {named(location)} if it should be read" if location and not shape else ""
    return (
        f"{who} fails {_alone_in(stage)} where {other} passes, so what it sent {what}: compare its payload with "
        f"{other}'s; validate it in preprocess and {REFUSE_ALONE}{where}"
    )


def together_fix(count: int, stage: str, location: Location | None) -> str:
    """The fix for a batch that fails ``stage`` although each of its requests passes alone:
    what they sent differs where the handler puts them together."""
    where = f", or make {named(location)} pad them" if location else ""
    return (
        f"each of the {count} requests passes {_alone_in(stage)}, so it is their combination that fails: what they "
        "sent differs where the handler puts them together (lists of different lengths, images of different "
        "sizes); compare their payloads, and where one has the wrong size, validate it in preprocess and "
        f"{REFUSE_ALONE}{where}"
    )


def _alone_in(stage: str) -> str:
    return "alone" if stage == "handle" else f"{stage} alone"


# -- the input at fault ---------------------------------------------------------------------

# Errors of a decoder reading bytes it cannot (module and name, as the class says them).
_DECODE_ERRORS = {
    ("builtins", "EOFError"),
    ("builtins", "UnicodeDecodeError"),
    ("wave", "Error"),
    ("struct", "error"),
    ("json.decoder", "JSONDecodeError"),
    ("binascii", "Error"),
    ("zlib", "error"),
    ("PIL", "UnidentifiedImageError"),
}
_TRUNCATED = ("image file is truncated", "broken data stream")  # PIL's OSError for a cut image


def _decodes(exc: BaseException) -> bool:
    """Whether ``exc`` is a decoder's refusal of the bytes it was given."""
    if any((cls.__module__, cls.__qualname__) in _DECODE_ERRORS for cls in type(exc).__mro__):
        return True
    return isinstance(exc, OSError) and any(t in str(exc) for t in _TRUNCATED)


def _out_of_embedding(exc: BaseException) -> tuple[int | None, int] | None:
    """``(an index out of range, the embedding's row count)`` when ``exc`` is torch's
    ``index out of range in self`` from ``torch.nn.functional.embedding`` (read off the frame's
    ``input`` and ``weight``; the index is None when it cannot be read), else None."""
    if not isinstance(exc, IndexError) or "index out of range in self" not in str(exc):
        return None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "embedding" and code.co_filename.endswith(os.path.join("torch", "nn", "functional.py")):
            found: dict[str, Any] = tb.tb_frame.f_locals
            try:
                indices, rows = found["input"], int(found["weight"].shape[0])
            except (KeyError, AttributeError, IndexError, TypeError):
                return None
            try:
                value: int | None = int(indices[(indices < 0) | (indices >= rows)].flatten()[0])
            except Exception:  # not a tensor after all: the row count is enough to go on
                value = None
            return value, rows
        tb = tb.tb_next
    return None


def input_fix(
    stage: str, exc: BaseException, who: str | None, other: str | None, alone: Alone, locations: list[Location]
) -> str | None:
    """The fix for an exception that says the input is at fault, not the code: an index out of
    an embedding's range, bytes a decoder refuses (in preprocess or a handle of its own), a
    shape the model refuses from one request where another's fits. None when ``exc`` is none
    of these, or when the requests run alone (``alone``) each pass (only their combination
    fails)."""
    if alone.ran and alone.failing is None:  # only their combination fails
        return None
    at = f" at {named(locations[-1])}" if locations else ""
    embedding = _out_of_embedding(exc)
    if embedding is not None:
        value, rows = embedding
        sent = f"the index {value}" if value is not None else "an index"
        has = f"the embedding{at} has no row for (it has {rows}, 0 to {rows - 1})"
        if alone.all_fail:  # maybe every client, maybe the handler's own mapping
            return (
                f"each request run alone gives {sent} or another that {has}: if the clients' payloads are right, "
                f"correct how preprocess maps them to indices; else validate them in preprocess and {REFUSE_ALONE}"
            )
        return f"{who or 'a request'} sent {sent}, which {has}: validate it in preprocess and {REFUSE_ALONE}"
    if stage in ("preprocess", "handle") and _decodes(exc):
        cause = suggest_fix(stage, exc) or "the client sent a truncated or malformed payload"
        whose = f"{who}'s" if who else "a request's"
        return (
            f"{whose} bytes do not decode ({type(exc).__name__}{at}): {cause}. A handler cannot trust what clients "
            f"send: validate it in preprocess and {REFUSE_ALONE}"
        )
    text = f"{type(exc).__name__}: {exc}"
    if who and other and any(n in text for n in _SHAPE):
        return payload_fix(who, other, stage, None, shape=True)
    return None
