"""Turning an exception raised inside a stage into a :class:`~handlerkit.errors.StageError`
that names the stage, the handler, the request, where in the user's code it was raised, and
the fix.

handlerkit's own errors carry their fix (``error.fix``). For everything else a short table
matches the usual ways a stage fails (a foreign library's message is the only thing to go on
there); failing that, the fix points at the line of the handler that raised.
"""

from __future__ import annotations

import inspect
import linecache
import os
import sysconfig
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from handlerkit._text import suggestion
from handlerkit.batches import payload
from handlerkit.errors import HandlerkitError, RequestError, StageError
from handlerkit.formats import STATE_DICT_FIX
from handlerkit.recording.spy import SPIED, is_spied

__all__ = [
    "batch_error",
    "failing_request",
    "handler_files",
    "missing_key_fix",
    "raised_at",
    "refresh_sources",
    "stage_error",
    "stage_of",
    "suggest_fix",
]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HANDLERS = os.path.join(_PACKAGE, "handlers")

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
        ("mat1 and mat2 shapes cannot be multiplied", "size mismatch", "shape '[", "Given groups", "expected input"),
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


def _library_file(path: str) -> bool:
    """Files of the standard library, installed packages, and handlerkit's own machinery
    (its handlers are user-facing code, so they do not count)."""
    path = os.path.abspath(path)
    if path.startswith(_PACKAGE + os.sep) and not path.startswith(_HANDLERS + os.sep):
        return True
    if path.startswith("<"):
        return True
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        root = sysconfig.get_paths().get(key)
        if root and path.startswith(os.path.abspath(root) + os.sep):
            return True
    return False


def raised_at(exc: BaseException, files: set[str] | frozenset[str] = frozenset()) -> tuple[str, int, str] | None:
    """``(file, line, source text)`` of the innermost frame of ``exc``'s traceback in ``files``
    (the handler's own source files), else in any code that is not a library, else None. A
    ``SyntaxError`` is located where it says it is (its traceback is the compiler's caller)."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        text = exc.text if exc.text is not None else linecache.getline(exc.filename, exc.lineno)
        return exc.filename, exc.lineno, text.strip()
    frames: list[tuple[str, int]] = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    wanted = {os.path.abspath(f) for f in files}
    chosen = next((f for f in reversed(frames) if os.path.abspath(f[0]) in wanted), None)
    if chosen is None:
        chosen = next((f for f in reversed(frames) if not _library_file(f[0])), None)
    if chosen is None:
        return None
    filename, line = chosen
    return filename, line, linecache.getline(filename, line).strip()


def refresh_sources(files: Iterable[str]) -> None:
    """Forget the cached text of ``files`` that changed on disk since it was read, so the line
    an error shows is the line of the file as it is (``linecache`` keeps what it read first)."""
    for file in files:
        linecache.checkcache(file)


def stage_error(
    stage: str,
    exc: BaseException,
    *,
    handler: str,
    request_index: int | None,
    handler_files: set[str] | frozenset[str] = frozenset(),
    then: str | None = None,
    request_name: str | None = None,
    fix: str | None = None,
    headline: str | None = None,
) -> StageError:
    """The :class:`StageError` for ``exc`` raised in ``stage``.

    ``then`` ends a fix that points at the raising line: what to do once it is corrected (the
    notebook's ``"h.reload() and run <stage> again"`` by default; a server says its own).
    ``request_name`` names the request at fault in place of its index (the file a command line
    read it from); ``fix`` is one found by looking at the batch (:func:`missing_key_fix`), or
    ``""`` when that ruled the usual causes out (the fix then points at the raising line);
    ``headline`` replaces ``"<stage> failed in <handler> ..."`` (a reload says what it kept).
    """
    # initialize and reload run before any batch: they are about no request.
    if stage in _BATCHLESS:
        where = ""
    elif request_name is not None:
        where = f" for {request_name}"
    elif request_index is not None:
        where = f" for request {request_index}"
    else:
        where = " for the batch"
    # handlerkit's own errors say what is wrong and how to fix it; for any other exception the
    # line of the handler that raised it is the most useful pointer.
    location = None if isinstance(exc, HandlerkitError) else raised_at(exc, handler_files)
    # Its fix is added once, below (str() of a handlerkit error would carry it too).
    what = exc.reason if isinstance(exc, RequestError) else exc.message if isinstance(exc, HandlerkitError) else exc
    message = f"{headline or f'{stage} failed in {handler}{where}'}: {type(exc).__name__}: {what}"
    if location is not None:
        message += f"\n  at {location[0]}:{location[1]}: {location[2]}"
    if fix is None:
        fix = suggest_fix(stage, exc)
    if not fix and location is not None:
        again = "h.reload() again" if stage == "reload" else f"h.reload() and run {stage} again"
        fix = (
            f"{type(exc).__name__} was raised at {os.path.basename(location[0])} line {location[1]}; "
            f"correct it there, then {then or again}"
        )
    return StageError(
        message, stage=stage, handler=handler, request_index=request_index, original=exc, fix=fix, location=location
    )


_BATCHLESS = ("initialize", "reload")


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
                f"a JSON object with {keys}. Send {key!r} in the request, or check for it in preprocess and raise "
                "hk.RequestError(message, index) so the client gets a 400 that says what to send"
            )
        if key.isdigit():  # a class index, not a parameter's name
            return ""
        fields = [str(k) for k in row if k not in ("data", "body")]
        if fields and key not in ("data", "body"):  # a form of named fields: the client left one out
            return (
                f"the client's form lacks the field {key!r}{suggestion(key, fields)}: {who} sent the fields "
                f"{', '.join(repr(k) for k in row)}. Send {key!r} as a form field, or check for it in preprocess "
                "and raise hk.RequestError(message, index) so the client gets a 400 that says what to send"
            )
        return (
            f"{who} has no parameter {key!r} (it has {', '.join(repr(k) for k in row)}): TorchServe puts "
            "a raw body under 'body' and form fields under their names; read the payload with "
            "row.get('data') or row.get('body')"
        )
    return "" if rows else None


def handler_files(handler: Any) -> frozenset[str]:
    """The source files of a handler's methods (every class of its MRO), or of a function
    handler: where its code really ran from, as tracebacks name it."""
    if inspect.isfunction(handler):
        return frozenset({os.path.abspath(handler.__code__.co_filename)})
    files = set()
    for owner in type(handler).__mro__[:-1]:
        if is_spied(owner):
            continue  # the harness's own subclass: its methods only pass calls on
        for member in vars(owner).values():
            func = getattr(member, "__func__", member)
            try:
                func = inspect.unwrap(func)  # a decorated method's code is the decorated function's
            except ValueError:  # a __wrapped__ cycle
                pass
            code = getattr(func, "__code__", None)
            if code is not None:
                files.add(os.path.abspath(code.co_filename))
    return frozenset(files)


def failing_request(
    preprocess: Callable[[Any], Any], batch: Any, context: Any, imports: Callable[[], Any]
) -> int | None:
    """The index of the first request whose preprocess fails alone (the context is bound back
    to the whole batch after), or None when each passes alone."""
    return _alone(preprocess, batch, context, imports)[0]


def _alone(
    preprocess: Callable[[Any], Any], batch: Any, context: Any, imports: Callable[[], Any]
) -> tuple[int | None, int | None]:
    """``(the first request whose preprocess fails alone, one that passes alone)``, each None
    when there is none; requests run one at a time until both are known."""
    failing = passing = None
    try:
        for i, single in enumerate(batch.split()):
            single.bind(context)
            try:
                with imports(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if inspect.iscoroutine(answer := preprocess(single.data)):
                        answer.close()  # an async stage: not awaited here, so no request is told apart
                        return None, None
            except Exception:
                failing = i if failing is None else failing
            else:
                passing = i if passing is None else passing
            if failing is not None and passing is not None:
                break
    finally:
        batch.bind(context)
    return failing, passing


def _payload_fix(who: str, other: str, location: tuple[str, int, str] | None) -> str:
    """The fix for a request that fails preprocess alone where another passes: what it sent
    (a value of the wrong type, a malformed field) is what the handler cannot read."""
    where = f", or correct {os.path.basename(location[0])} line {location[1]} if it should be read" if location else ""
    return (
        f"{who} fails preprocess alone where {other} passes, so what it sent is what the handler cannot read: "
        f"compare its payload with {other}'s; refuse such a payload in preprocess with "
        f"hk.RequestError(message, index) so the client gets a 400 that says what to send{where}"
    )


def _together_fix(count: int, location: tuple[str, int, str] | None) -> str:
    """The fix for a batch whose preprocess fails although each of its requests passes alone:
    what they sent differs where the handler puts them together."""
    where = f", or make {os.path.basename(location[0])} line {location[1]} pad them" if location else ""
    return (
        f"each of the {count} requests passes preprocess alone, so it is their combination that fails: what they "
        "sent differs where the handler puts them together (lists of different lengths, images of different "
        "sizes); compare their payloads, and refuse one of the wrong size in preprocess with "
        f"hk.RequestError(message, index) so the client gets a 400 that says what to send{where}"
    )


def stage_of(exc: BaseException, handler: Any) -> str:
    """The stage an exception raised inside ``handle`` came from, read off its traceback: the
    innermost frame running one of ``handler``'s stage methods (its class's or a base class's
    ``preprocess``, ``inference``, ``postprocess``, ``explain_handle``, ``describe_handle``),
    else ``"handle"``. For a server, which has no recorder watching the stages."""
    codes: dict[Any, str] = {}
    for owner in type(handler).__mro__[:-1]:
        for name, stage in SPIED:
            member = vars(owner).get(name)
            func = getattr(member, "__func__", member)
            try:
                func = inspect.unwrap(func) if func is not None else None
            except ValueError:  # a __wrapped__ cycle
                pass
            code = getattr(func, "__code__", None)
            if code is not None:
                codes.setdefault(code, stage)
    found = "handle"
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        seen = codes.get(tb.tb_frame.f_code)
        if seen is not None:
            found = seen
        tb = tb.tb_next
    return found


def batch_error(
    stage: str,
    exc: BaseException,
    *,
    handler: Any,
    handler_name: str,
    batch: Any,
    context: Any,
    imports: Callable[[], Any],
    handler_files: frozenset[str] = frozenset(),
    on_batch_data: bool = False,
    then: str | None = None,
    request_names: Mapping[str, str] | None = None,
    enveloped: bool = False,
) -> StageError:
    """The :class:`StageError` for ``exc`` raised in ``stage`` of a batch, with the request at
    fault when it can be told: the error's own ``request_index``, the only request of a batch of
    one, or (for preprocess given the batch's own data, ``on_batch_data``) the first request
    whose preprocess fails alone (:func:`failing_request`); when another passes alone, and no
    usual cause fits, the fix says it is what that request sent, and when each passes alone,
    that it is what they sent together. handlerkit's own errors are about the batch unless they
    say otherwise.

    ``request_names`` maps request ids to what the message calls them (a file name);
    ``enveloped``: the handler got an envelope's view of the batch, not its request rows, so a
    ``KeyError`` is not read against them (:func:`missing_key_fix`)."""
    index = getattr(exc, "request_index", None)
    about_a_request = not isinstance(exc, HandlerkitError)  # handlerkit's own errors say so themselves
    count = len(batch) if batch is not None else None
    if index is None and count == 1 and about_a_request:
        index = 0
    passing = None  # a request that passes preprocess alone, where the one at fault fails
    if index is None and stage == "preprocess" and about_a_request and on_batch_data and count and count > 1:
        preprocess = getattr(handler, "preprocess", None)
        if callable(preprocess):
            index, passing = _alone(preprocess, batch, context, imports)
    names: dict[int, str] = {}  # what the messages call the requests named in request_names
    if request_names and batch is not None:
        names = {i: request_names[r.request_id] for i, r in enumerate(batch) if r.request_id in request_names}
    fix = None
    if isinstance(exc, KeyError) and about_a_request and stage in ("preprocess", "handle") and not enveloped:
        fix = missing_key_fix(exc, batch.data, index, names) if batch is not None else None
    name = names.get(index) if index is not None else None
    if fix is None and index is not None and passing is not None and suggest_fix(stage, exc) is None:
        who, other = name or f"request {index}", names.get(passing) or f"request {passing}"
        fix = _payload_fix(who, other, raised_at(exc, handler_files))
    elif fix is None and index is None and passing is not None and suggest_fix(stage, exc) is None:  # each passes
        fix = _together_fix(count or 0, raised_at(exc, handler_files))
    return stage_error(
        stage,
        exc,
        handler=handler_name,
        request_index=index,
        handler_files=handler_files,
        then=then,
        request_name=name,
        fix=fix,
    )
