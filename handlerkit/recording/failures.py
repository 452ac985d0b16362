"""Turning an exception raised inside a stage into a :class:`~handlerkit.errors.StageError`
that names the stage, the handler, the request, where in the user's code it was raised, and
the fix.

The request at fault is the error's own, the only one of a batch of one, or the one that fails
when the requests are run alone (:mod:`handlerkit.recording.alone`); the user's lines are read
off the traceback (:mod:`handlerkit.worker.locations`); the fix tells the input from the code
(:mod:`handlerkit.recording.fixes`), and failing all else points at the line that raised.
"""

from __future__ import annotations

import inspect
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from handlerkit.errors import HandlerkitError, RequestError, StageError
from handlerkit.recording.alone import Alone, run_alone
from handlerkit.recording.fixes import REFUSE_ALONE, input_fix, missing_key_fix, payload_fix, suggest_fix, together_fix
from handlerkit.recording.spy import SPIED, is_spied
from handlerkit.worker.locations import Location, cell_name, named, raised_at, raised_in, refresh_sources, shown_at

__all__ = [  # REFUSE_ALONE, missing_key_fix, suggest_fix: the fixes', here too, where they always were
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
    through (:func:`~handlerkit.worker.locations.raised_in`, innermost last; a notebook
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
        fix = input_fix(stage, exc, who, other, found, locations)
    usual = fix is None and suggest_fix(stage, exc) is not None
    if fix is None and who and other and not usual:
        fix = payload_fix(who, other, stage, location, shape=False)
    elif fix is None and found.ran and found.failing is None and not usual:  # each passes alone
        fix = together_fix(count or 0, stage, location)
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
    if enveloped:
        return Alone(why_not="the handler got a service envelope's view of the batch, not its requests")
    if stage in _CHAIN and on_batch_data:
        stages: list[Any] = [getattr(handler, name, None) for name in _CHAIN[: _CHAIN.index(stage) + 1]]
        if all(callable(s) for s in stages):
            return run_alone(batch, context, imports, handler, stages=stages)
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
