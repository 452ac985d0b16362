"""Where in the user's code an exception was raised: one line per user file it passed through.

A traceback out of a handler runs through handlerkit's machinery, the handler, the user's model
file, and libraries (torch, PIL, the standard library). What the user can correct is in their
own files, and the line nearest the failure in each of them is worth showing: the handler's
``self.model(*inputs)`` *and* the model file's ``self.items(item_ids)`` it reached.

A class defined in a notebook cell runs from a file named after the cell's source
(``/tmp/ipykernel_<pid>/<hash>.py`` under Jupyter, ``<ipython-input-N-…>`` under IPython):
its lines are named as IPython names them, ``Cell In[3], line 7``.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from handlerkit.worker.freshness import compiled_at

__all__ = ["cell_name", "defined_in_cell", "named", "raised_at", "raised_in", "refresh_sources", "shown_at"]

#: ``(file, line, source text)``.
Location = tuple[str, int, str]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HANDLERS = os.path.join(_PACKAGE, "handlers")

# ipykernel compiles each cell under ``<tempdir>/ipykernel_<pid>/<murmur hash of the source>.py``
# (ipykernel.compiler.get_file_name); plain IPython under ``<ipython-input-<count>-<hash>>``.
_KERNEL_CELL = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")
_IPYTHON_CELL = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>$")


def cell_name(filename: str) -> str | None:
    """IPython's name for the notebook cell compiled under ``filename`` (``"Cell In[3]"``), as
    its tracebacks say it; ``"a notebook cell"`` for a cell's file whose execution count is not
    known here (no IPython shell in this process); None for a file that is no cell."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    format_code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if callable(format_code_name):
        try:
            label = format_code_name(filename)  # ("Cell", "In[3]") for a cell it compiled, else None
        except Exception:  # a shell of another make: fall back to the file's name
            label = None
        if isinstance(label, tuple) and len(label) == 2:
            return f"{label[0]} {label[1]}"
    counted = _IPYTHON_CELL.search(filename)
    if counted:
        return f"Cell In[{counted.group(1)}]"
    if _KERNEL_CELL.search(filename):
        return "a notebook cell"
    return None


def defined_in_cell(target: Any) -> str | None:
    """The cell (:func:`cell_name`) that defines the class or function ``target``, read off
    its own methods' code; None when it comes from a file."""
    code = getattr(target, "__code__", None)
    if code is not None:
        return cell_name(code.co_filename)
    for member in vars(target).values() if isinstance(target, type) else ():
        code = getattr(getattr(member, "__func__", member), "__code__", None)
        if code is not None and (cell := cell_name(code.co_filename)) is not None:
            return cell
    return None


def shown_at(location: Location) -> str:
    """How a message's ``at …`` line names a location: ``/path/handler.py:19``, or ``Cell In[3], line 7``."""
    cell = cell_name(location[0])
    return f"{cell}, line {location[1]}" if cell else f"{location[0]}:{location[1]}"


def named(location: Location) -> str:
    """How a fix names a location: ``handler.py line 19``, or ``Cell In[3], line 7``."""
    cell = cell_name(location[0])
    return f"{cell}, line {location[1]}" if cell else f"{os.path.basename(location[0])} line {location[1]}"


def _library_file(path: str) -> bool:
    """Files of the standard library, installed packages, and handlerkit's own machinery
    (its handlers are user-facing code, so they do not count); code compiled from a string
    (``<string>``, generated code), but not a notebook cell's."""
    if path.startswith("<"):
        return cell_name(path) is None
    path = os.path.abspath(path)
    if path.startswith(_PACKAGE + os.sep) and not path.startswith(_HANDLERS + os.sep):
        return True
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        root = sysconfig.get_paths().get(key)
        if root and path.startswith(os.path.abspath(root) + os.sep):
            return True
    return False


def _handlerkit_file(path: str) -> bool:
    return os.path.abspath(path).startswith(_PACKAGE + os.sep)


def raised_in(exc: BaseException, files: Iterable[str] = ()) -> list[Location]:
    """The user's lines ``exc`` was raised through, one per user file (the innermost line of
    that file), **outermost first, innermost last** (a traceback's order).

    User files are those of no library (:func:`_library_file`): the handler's, the model dir's
    ``model.py`` and helpers, a notebook cell's; and ``files``, the handler's own source files
    even when installed (TorchServe's handlers, run as they are). Only the frames from the
    outermost one in code of the user's own (none of handlerkit's or of ``files`` installed as a
    library) inwards count, so a ``BaseHandler.handle`` calling a user's stage is not listed; a
    handler used as it is gives its innermost line. A ``SyntaxError`` is located where it says
    it is (its traceback is the compiler's caller)."""
    if (compiled := compiled_at(exc)) is not None:
        return [compiled]
    handler_files = {os.path.abspath(f) for f in files}
    frames: list[tuple[str, int, bool]] = []  # (file, line, whether the user wrote it)
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        library = _library_file(filename)
        if not library or os.path.abspath(filename) in handler_files:
            frames.append((filename, tb.tb_lineno, not library and not _handlerkit_file(filename)))
        tb = tb.tb_next
    own = next((i for i, (_, _, theirs) in enumerate(frames) if theirs), None)
    frames = frames[own:] if own is not None else frames[-1:]
    innermost: dict[str, int] = {}  # file -> its innermost line, in the order of those lines
    for filename, line, _ in frames:
        innermost.pop(filename, None)
        innermost[filename] = line
    return [(filename, line, linecache.getline(filename, line).strip()) for filename, line in innermost.items()]


def raised_at(exc: BaseException, files: Iterable[str] = ()) -> Location | None:
    """``(file, line, source text)`` of the innermost of :func:`raised_in`, else None."""
    found = raised_in(exc, files)
    return found[-1] if found else None


def refresh_sources(files: Iterable[str]) -> None:
    """Forget the cached text of ``files`` that changed on disk since it was read, so the line
    an error shows is the line of the file as it is (``linecache`` keeps what it read first)."""
    for file in files:
        linecache.checkcache(file)
