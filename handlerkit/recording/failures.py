"""Turning an exception raised inside a stage into a :class:`~handlerkit.errors.StageError`
that names the stage, the handler, the request, where in the user's code it was raised, and
the fix.

handlerkit's own errors carry their fix (``error.fix``). For everything else the fix tells the
input from the code: an index out of an embedding's range, bytes that do not decode, a request
that fails alone where another passes (run alone by :mod:`handlerkit.recording.alone`) are what
a client sent, and the fix says to refuse that request; a short table matches the usual ways a
stage fails (a foreign library's message is the only thing to go on there); failing that, the
fix points at the line of the user's code that raised (:mod:`handlerkit.recording.locations`).
"""

from __future__ import annotations

import inspect
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from handlerkit._text import suggestion
from handlerkit.batches import payload
from handlerkit.errors import HandlerkitError, RequestError, StageError
from handlerkit.formats import STATE_DICT_FIX
from handlerkit.recording.alone import Alone, run_alone
from handlerkit.recording.locations import Location, cell_name, named, raised_at, raised_in, refresh_sources, shown_at
from handlerkit.recording.spy import SPIED, is_spied

__all__ = [
    "REFUSE_ALONE",
    "batch_error",
    "fed_by",
    "handler_files",
    "missing_key_fix",
    "raised_at",
    "refresh_sources",
    "stage_error",
    "stage_of",
    "suggest_fix",
]

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
    notes: Sequence[str] = (),
) -> StageError:
    """The :class:`StageError` for ``exc`` raised in ``stage``.

    The message has one ``at file:line: source`` line per user file the exception was raised
    through (:func:`~handlerkit.recording.locations.raised_in`, innermost last; a notebook
    cell's as ``at Cell In[3], line 7: source``), then ``notes`` (what running the requests
    alone found), one line each.

    ``then`` ends a fix that points at the raising line: what to do once it is corrected (the
    notebook's ``"h.reload() and run <stage> again"`` by default, re-running the cell for a
    line in a notebook cell; a server says its own). ``request_name`` names the request at
    fault in place of its index (the file a command line read it from); ``fix`` is one found by
    looking at the batch (:func:`missing_key_fix`), or ``""`` when that ruled the usual causes
    out (the fix then points at the raising line); ``headline`` replaces ``"<stage> failed in
    <handler> ..."`` (a reload says what it kept).
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
    # lines of the user's code that raised it are the most useful pointer.
    locations = [] if isinstance(exc, HandlerkitError) else raised_in(exc, handler_files)
    location = locations[-1] if locations else None
    # Its fix is added once, below (str() of a handlerkit error would carry it too).
    what = exc.reason if isinstance(exc, RequestError) else exc.message if isinstance(exc, HandlerkitError) else exc
    message = f"{headline or f'{stage} failed in {handler}{where}'}: {type(exc).__name__}: {what}"
    message += "".join(f"\n  at {shown_at(at)}: {at[2]}" for at in locations)
    message += "".join(f"\n  {note}" for note in notes)
    if fix is None:
        fix = suggest_fix(stage, exc)
    if not fix and location is not None:
        fix = f"{type(exc).__name__} was raised at {named(location)}; correct it there, then {then or _again(stage, location)}"
    return StageError(
        message,
        stage=stage,
        handler=handler,
        request_index=request_index,
        original=exc,
        fix=fix,
        location=location,
        locations=locations,
    )


def _again(stage: str, location: Location) -> str:
    """What the notebook does once the line at ``location`` is corrected."""
    if cell_name(location[0]) is not None:  # h.reload() reads files; a cell is run again by hand
        return "re-run the cell and build a new Harness from what it defines (h.reload() cannot reload a cell)"
    return "h.reload() again" if stage == "reload" else f"h.reload() and run {stage} again"


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


def _payload_fix(who: str, other: str, stage: str, location: Location | None, shape: bool) -> str:
    """The fix for a request that fails ``stage`` alone where another passes: what it sent (a
    value of the wrong type, a malformed field, a ``shape`` the model refuses) is at fault."""
    what = "gives a shape the model refuses" if shape else "is what the handler cannot read"
    where = f", or correct {named(location)} if it should be read" if location and not shape else ""
    return (
        f"{who} fails {_alone_in(stage)} where {other} passes, so what it sent {what}: compare its payload with "
        f"{other}'s; validate it in preprocess and {REFUSE_ALONE}{where}"
    )


def _together_fix(count: int, stage: str, location: Location | None) -> str:
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


def _input_fix(
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
        return _payload_fix(who, other, stage, None, shape=True)
    return None


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
    service: Any = None,
    stepped: Mapping[str, Any] | None = None,
    alone: bool = True,
) -> StageError:
    """The :class:`StageError` for ``exc`` raised in ``stage`` of a batch, with the request at
    fault when it can be told: the error's own ``request_index``, the only request of a batch of
    one, or the first request that fails alone (:func:`~handlerkit.recording.alone.run_alone`):

    - through the stages from preprocess up to ``stage`` (``on_batch_data``: that is how the
      stage got its input, from the batch's own data, as in TorchServe's ``BaseHandler.handle``);
    - else through ``handle`` whole, for a single-stage ``service`` (a function handler, an
      override) that is not async;
    - else not, and the message says why (an envelope's view of the batch, an input stepped by
      hand, an async stage).

    When another request passes alone, and no usual cause fits, the fix says it is what that
    request sent; when each passes alone, the message says so and the fix that it is what they
    sent together. An index out of an embedding's range, bytes that do not decode, a shape the
    model refuses from one request point at validating the payload and refusing that request.
    handlerkit's own errors are about the batch unless they say otherwise.

    ``request_names`` maps request ids to what the message calls them (a file name);
    ``enveloped``: the handler got an envelope's view of the batch, not its request rows, so a
    ``KeyError`` is not read against them (:func:`missing_key_fix`) nor are the requests run
    alone; ``stepped``: the harness's results when ``stage`` was stepped by hand
    (``h.inference()``), whose inputs say whether it ran on the batch's requests; ``alone``:
    False to run no request alone (an error ``handle`` caught, and answered anyway)."""
    index = getattr(exc, "request_index", None)
    about_a_request = not isinstance(exc, HandlerkitError)  # handlerkit's own errors say so themselves
    count = len(batch) if batch is not None else None
    if index is None and count == 1 and about_a_request:
        index = 0
    found = Alone()
    if index is None and about_a_request and count and count > 1 and alone:
        found = _requests_alone(stage, handler, batch, context, imports, on_batch_data, enveloped, service, stepped)
        index = found.failing if found.one_at_fault else None
    names: dict[int, str] = {}  # what the messages call the requests named in request_names
    if request_names and batch is not None:
        names = {i: request_names[r.request_id] for i, r in enumerate(batch) if r.request_id in request_names}
    name = names.get(index) if index is not None else None
    who = name or (f"request {index}" if index is not None else None)
    other = (names.get(found.passing) or f"request {found.passing}") if found.passing is not None else None
    locations = raised_in(exc, handler_files)
    location = locations[-1] if locations else None
    fix = None
    if isinstance(exc, KeyError) and about_a_request and stage in ("preprocess", "handle") and not enveloped:
        fix = missing_key_fix(exc, batch.data, index, names) if batch is not None else None
    if fix is None and about_a_request:
        fix = _input_fix(stage, exc, who, other, found, locations)
    usual = fix is None and suggest_fix(stage, exc) is not None
    if fix is None and who and other and not usual:
        fix = _payload_fix(who, other, stage, location, shape=False)
    elif fix is None and found.ran and found.failing is None and not usual:  # each passes alone
        fix = _together_fix(count or 0, stage, location)
    notes = []
    if found.ran and found.failing is None:
        notes.append(f"run alone, each of the {count} requests passes: only the batch as a whole fails")
    elif found.all_fail:
        each = f"each of the {count} requests" if found.tried == count else f"each of the first {found.tried} requests"
        notes.append(f"run alone, {each} fails too: no one request is at fault")
    if found.why_not:
        notes.append(f"the requests were not run alone to find the one at fault: {found.why_not}")
    return stage_error(
        stage,
        exc,
        handler=handler_name,
        request_index=index,
        handler_files=handler_files,
        then=then,
        request_name=name,
        fix=fix,
        notes=notes,
    )


_CHAIN = ("preprocess", "inference", "postprocess")


def _requests_alone(
    stage: str,
    handler: Any,
    batch: Any,
    context: Any,
    imports: Callable[[], Any],
    on_batch_data: bool,
    enveloped: bool,
    service: Any,
    stepped: Mapping[str, Any] | None,
) -> Alone:
    """The requests of ``batch`` run alone the way ``stage`` can be retraced (see :func:`batch_error`)."""
    if stage not in (*_CHAIN, "handle"):
        return Alone()  # explain, describe: the handler's own business
    if stepped is not None and not fed_by(stepped, stage):
        return Alone(why_not=f"{stage} ran on an input given by hand (h.{stage}(value)), not on the batch's requests")
    if stage in _CHAIN and on_batch_data:
        stages: list[Any] = [getattr(handler, name, None) for name in _CHAIN[: _CHAIN.index(stage) + 1]]
        if all(callable(s) for s in stages):
            return run_alone(batch, context, imports, handler, stages=stages)
    if enveloped:
        return Alone(why_not="the handler got a service envelope's view of the batch, not its requests")
    if service is not None and (service.single_stage or stage == "handle"):
        if service.asynchronous:
            return Alone(why_not="its handle is async, and is not run again here")
        return run_alone(batch, context, imports, service.function or handler, handle=service.entry)
    return Alone(why_not=f"{stage} did not get its input from the batch's requests through preprocess")


def fed_by(results: Mapping[str, Any], stage: str, data: Any = None) -> bool:
    """Whether ``stage``'s input came from the stages before it in ``results`` (each called
    once, each given the one before's output), from preprocess on; with ``data``, whether
    preprocess was given that very list (the batch's data, as a run handed it to ``handle``)."""
    if stage not in _CHAIN:
        return False
    chain: list[Any] = [results.get(name) for name in _CHAIN[: _CHAIN.index(stage) + 1]]
    if any(r is None or r.calls != 1 for r in chain):
        return False
    if data is not None and chain[0].input is not data:
        return False
    return all(later.input is earlier.output for earlier, later in itertools.pairwise(chain))
