"""``Harness.reload``'s work: execute a handler's source file afresh and hand back the new
definition, leaving the old one in place when the new source fails."""

from __future__ import annotations

import importlib.util
import linecache
import os
import sys
from typing import Any

from handlerkit.errors import HandlerkitError
from handlerkit.isolation import exec_source
from handlerkit.recording.failures import stage_error
from handlerkit.recording.locations import defined_in_cell

__all__ = ["reexecuted"]


def reexecuted(target: Any, name: str) -> Any:
    """The class or function ``target`` as its module's file defines it now.

    The module is executed from source (never from stale bytecode) into a fresh module object,
    which replaces the old one in ``sys.modules`` only when it ran and still defines ``target``.

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
    module = sys.modules.get(target.__module__)
    path = getattr(module, "__file__", None)
    if target.__module__ == "__main__":
        raise HandlerkitError(
            f"cannot reload {name}: it is defined in the script being run (__main__), which reloading would run again",
            fix="define the handler in its own .py file (the model dir's handler.py) to reload it",
        )
    if module is None or not path or not os.path.isfile(path):
        raise HandlerkitError(
            f"cannot reload {name}: its module {target.__module__!r} has no source file",
            fix="define the handler in a .py file (the model dir's handler.py) to reload it",
        )
    spec = importlib.util.spec_from_file_location(module.__name__, path)
    if spec is None or spec.loader is None:
        raise HandlerkitError(f"cannot reload {name}: no loader for {path}")
    fresh = importlib.util.module_from_spec(spec)
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
    sys.modules[module.__name__] = fresh
    return replacement
