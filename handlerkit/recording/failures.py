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
from collections.abc import Callable
from types import TracebackType
from typing import Any

from handlerkit.errors import HandlerkitError, RequestError, StageError
from handlerkit.recording.spy import SPIED, is_spied

__all__ = ["batch_error", "failing_request", "handler_files", "raised_at", "stage_error", "stage_of", "suggest_fix"]

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
    (
        ("KeyError",),
        "a request lacks the field the handler reads: TorchServe puts a raw body under 'body' and form fields under their names ('data')",
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
    (the handler's own source files), else in any code that is not a library, else None."""
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


def stage_error(
    stage: str,
    exc: BaseException,
    *,
    handler: str,
    request_index: int | None,
    handler_files: set[str] | frozenset[str] = frozenset(),
    then: str | None = None,
) -> StageError:
    """The :class:`StageError` for ``exc`` raised in ``stage``.

    ``then`` ends a fix that points at the raising line: what to do once it is corrected (the
    notebook's ``"h.reload() and run <stage> again"`` by default; a server says its own).
    """
    # initialize and reload run before any batch: they are about no request.
    where = (
        ""
        if stage in _BATCHLESS
        else f" for request {request_index}"
        if request_index is not None
        else " for the batch"
    )
    # handlerkit's own errors say what is wrong and how to fix it; for any other exception the
    # line of the handler that raised it is the most useful pointer.
    location = None if isinstance(exc, HandlerkitError) else raised_at(exc, handler_files)
    # Its fix is added once, below (str() of a handlerkit error would carry it too).
    what = exc.reason if isinstance(exc, RequestError) else exc.message if isinstance(exc, HandlerkitError) else exc
    message = f"{stage} failed in {handler}{where}: {type(exc).__name__}: {what}"
    if location is not None:
        message += f"\n  at {location[0]}:{location[1]}: {location[2]}"
    fix = suggest_fix(stage, exc)
    if fix is None and location is not None:
        fix = (
            f"{type(exc).__name__} was raised at {os.path.basename(location[0])} line {location[1]}; "
            f"correct it there, then {then or f'h.reload() and run {stage} again'}"
        )
    return StageError(
        message, stage=stage, handler=handler, request_index=request_index, original=exc, fix=fix, location=location
    )


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


def failing_request(
    preprocess: Callable[[Any], Any], batch: Any, context: Any, imports: Callable[[], Any]
) -> int | None:
    """The index of the first request whose preprocess fails alone (the context is bound back
    to the whole batch after), or None when each passes alone."""
    try:
        for i, single in enumerate(batch.split()):
            single.bind(context)
            try:
                with imports(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    preprocess(single.data)
            except Exception:
                return i
    finally:
        batch.bind(context)
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
) -> StageError:
    """The :class:`StageError` for ``exc`` raised in ``stage`` of a batch, with the request at
    fault when it can be told: the error's own ``request_index``, the only request of a batch of
    one, or (for preprocess given the batch's own data, ``on_batch_data``) the first request
    whose preprocess fails alone (:func:`failing_request`). handlerkit's own errors are about
    the batch unless they say otherwise."""
    index = getattr(exc, "request_index", None)
    about_a_request = not isinstance(exc, HandlerkitError)  # handlerkit's own errors say so themselves
    count = len(batch) if batch is not None else None
    if index is None and count == 1 and about_a_request:
        index = 0
    if index is None and stage == "preprocess" and about_a_request and on_batch_data and count and count > 1:
        preprocess = getattr(handler, "preprocess", None)
        if callable(preprocess):
            index = failing_request(preprocess, batch, context, imports)
    return stage_error(stage, exc, handler=handler_name, request_index=index, handler_files=handler_files, then=then)
