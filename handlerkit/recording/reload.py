"""``Harness.reload``'s work: execute a handler's source file afresh and hand back the new
definition, leaving the old one in place when the new source fails; and the warning a harness
gives when the files its code was loaded from changed since."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import linecache
import os
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitError, HandlerkitWarning
from handlerkit.recording.failures import stage_error
from handlerkit.worker.freshness import exec_source
from handlerkit.worker.locations import defined_in_cell

if TYPE_CHECKING:
    from handlerkit.service import Service

__all__ = ["reexecuted", "warn_if_changed"]


def warn_if_changed(service: Service) -> None:
    """Warn once per change when files the handler's code was loaded from changed since
    (``handlerkit: handler.py changed since it was loaded: h.reload() to run it``); a stat per
    file (:meth:`Sources.changed <handlerkit.worker.freshness.Sources.changed>`)."""
    changed = service.sources.changed()
    if not changed:
        return
    names = [_shown(f, service.model_dir) for f in changed]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    they = "it was" if len(names) == 1 else "they were"
    warnings.warn(
        f"handlerkit: {listed} changed since {they} loaded: h.reload() to run {'it' if len(names) == 1 else 'them'}",
        HandlerkitWarning,
        stacklevel=user_stacklevel(),
    )


def _shown(file: str, model_dir: str | None) -> str:
    """A file as the user knows it: relative to the model dir when in it, else its name."""
    if model_dir and file.startswith(model_dir + os.sep):
        return os.path.relpath(file, model_dir)
    return os.path.basename(file)


def _namespace(target: Any) -> dict[str, Any] | None:
    """The globals of the module ``target`` (a class or function) was defined in: its own
    functions know them, whatever ``sys.modules`` holds under its module's name now (a model
    dir's module is there only inside its block, and not at all once a changed file made the
    dir's modules be forgotten)."""
    if hasattr(target, "__globals__"):
        return target.__globals__
    for value in vars(target).values():
        func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if callable(func):
            with contextlib.suppress(ValueError):  # a __wrapped__ cycle
                func = inspect.unwrap(func)  # a wrapped stage method (PerRequestErrors's) is the user's inside
        namespace = getattr(func, "__globals__", None)
        if namespace is not None and namespace.get("__name__") == target.__module__:
            return namespace
    module = sys.modules.get(target.__module__)  # a class that defines no function of its own
    return vars(module) if module is not None else None


def reexecuted(target: Any, name: str, service: Service) -> tuple[Any, ModuleType, bool]:
    """The class or function ``target`` (``service``'s handler) as its module's file defines it
    now, that module, and whether a file besides it changed since the service loaded it (then
    what ``initialize`` built may come from the old code).

    The module is executed from source (never from stale bytecode) into a fresh module object
    of the same name, which replaces the old one in ``sys.modules`` only when it ran and still
    defines ``target`` (within the model dir's block, the dir's cache keeps it).

    Raises:
        StageError: the new source raised (stage ``"reload"``, with the line and the fix).
        HandlerkitError: the module has no source file, or no longer defines ``target``.
    """
    cell = defined_in_cell(target)
    if cell is not None:  # its source is the cell's, run again only by running the cell
        raise HandlerkitError(
            f"cannot reload {name}: it is defined in a notebook cell ({cell}), which only running the cell again "
            "defines anew",
            fix=f"edit and re-run the cell that defines {name}, then build a new Harness from it: "
            f"h = hk.Harness({name}, h.context)",
        )
    module = service.module  # (a class that defines no function of its own does not tell its module)
    namespace = _namespace(target) or (vars(module) if module is not None else None)
    path = namespace.get("__file__") if namespace is not None else None
    module_name = namespace.get("__name__", target.__module__) if namespace is not None else target.__module__
    if target.__module__ == "__main__":
        raise HandlerkitError(
            f"cannot reload {name}: it is defined in the script being run (__main__), which reloading would run again",
            fix="define the handler in its own .py file (the model dir's handler.py) to reload it",
        )
    if not isinstance(path, str) or not os.path.isfile(path):
        raise HandlerkitError(
            f"cannot reload {name}: its module {target.__module__!r} has no source file",
            fix="define the handler in a .py file (the model dir's handler.py) to reload it",
        )
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise HandlerkitError(f"cannot reload {name}: no loader for {path}")
    fresh = importlib.util.module_from_spec(spec)
    edited = service.sources.differ()
    try:
        exec_source(fresh, path)
    except Exception as exc:
        linecache.updatecache(path)  # the error's line is shown from the file that failed, as it is now
        headline = f"reload of {os.path.basename(path)} failed, {name} keeps its previous code"
        raise stage_error(
            "reload", exc, handler=name, request_index=None, handler_files=frozenset({path}), headline=headline
        ) from exc
    # Errors raised by the new code show their lines from this source, not the one read before.
    linecache.updatecache(path)
    replacement = getattr(fresh, target.__name__, None)
    if replacement is None:
        raise HandlerkitError(
            f"reload of {path}: it no longer defines {target.__name__}; the handler keeps its previous code",
            fix=f"define {target.__name__} again in {os.path.basename(path)}, or build a new Harness",
        )
    sys.modules[module_name] = fresh
    return replacement, fresh, bool(set(edited) - {path})
