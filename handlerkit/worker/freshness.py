"""Whether loaded code is the code on disk: the :class:`Stamp` of the source each module of a
model dir ran, a loader that compiles those files from their source (never a stale ``.pyc``),
and :class:`Sources`, the files some loaded code came from, told when they change.

A ``.pyc`` is validated by its source's mtime in whole seconds and its size, so a file edited
in place within a second to the same size would run its previous code: a notebook's
edit-and-run loop does exactly that. A stamp keeps a hash of the bytes that ran, which is what
decides whether a file changed; mtime and size only save reading a file that did not move.
:mod:`handlerkit.worker.isolation` uses these for its per-dir module caches, and the Harness for its
"handler.py changed since it was loaded" warning.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import linecache
import os
import sys
import time
import weakref
from collections.abc import Iterable
from types import CodeType, ModuleType
from typing import Any, NamedTuple

__all__ = [
    "TORCHSERVE_MISSING_FIX",
    "Sources",
    "Stamp",
    "compiled_at",
    "exec_source",
    "failed_at",
    "import_failure",
    "module_of",
    "note",
    "read_stamp",
    "stale",
    "stamp_of",
    "torchserve_missing",
    "use_source_finder",
]


class Stamp(NamedTuple):
    """What a source file held: its ``mtime_ns`` and size (cheap to compare) and a hash of its
    bytes (what decides: an edit in place within the same clock tick keeps mtime and size)."""

    mtime_ns: int
    size: int
    digest: bytes


def _stamp(stat: os.stat_result, data: bytes) -> Stamp:
    return Stamp(stat.st_mtime_ns, stat.st_size, importlib.util.source_hash(data))


def read_stamp(path: str) -> Stamp | None:
    """The :class:`Stamp` of ``path`` as it is now; None when it cannot be read (removed)."""
    try:
        with open(path, "rb") as f:
            return _stamp(os.fstat(f.fileno()), f.read())
    except OSError:
        return None


#: module -> the stamp of the source it ran (set where handlerkit compiled it, else when first asked).
_stamps: weakref.WeakKeyDictionary[ModuleType, Stamp] = weakref.WeakKeyDictionary()


def note(module: ModuleType, stat: os.stat_result, data: bytes) -> None:
    """Remember that ``module`` ran ``data``, read from a file with ``stat``."""
    _stamps[module] = _stamp(stat, data)


def stamp_of(module: Any) -> Stamp | None:
    """The stamp of the source ``module`` ran; None for a module without a source file. A module
    handlerkit did not compile (imported the ordinary way) is taken to have run its file as it
    is when first asked."""
    stamp = _stamps.get(module)
    if stamp is None:
        loader = getattr(getattr(module, "__spec__", None), "loader", None)
        stamp = loader.stamp if isinstance(loader, _SourceLoader) else None
        if stamp is None:
            file = getattr(module, "__file__", None)
            if not isinstance(file, str) or not file.endswith(".py"):
                return None
            stamp = read_stamp(file)
            if stamp is None:
                return None
        _stamps[module] = stamp
    return stamp


def module_of(definition: Any) -> ModuleType | None:
    """The module ``definition`` (a class or a function) was defined in, as ``sys.modules`` holds
    it now (inside a model dir's block, the dir's own); None when it holds another under that name."""
    module = sys.modules.get(getattr(definition, "__module__", None) or "")
    found = getattr(module, getattr(definition, "__name__", ""), None)
    mine = found is definition or any(found is cls for cls in getattr(definition, "__mro__", ()))  # (or a subclass)
    return module if mine else None


class Sources:
    """The files some loaded code ran from, each with the :class:`Stamp` of what it ran, and
    which of them changed since (``"handler.py changed since it was loaded"``).

    :meth:`changed` is made for every run of a Harness: a look stats each file and reads one only
    when its mtime or size moved, or when it was modified too recently for them to be trusted (an
    edit within the same clock tick keeps both). It looks on every call, so an edit made just
    before a run is told at that run (a notebook runs the cell after ``%%writefile`` within
    milliseconds); a loop of runs that must not pay a stat each (a diagnostic's) looks once
    before it (``Harness.preserved``).
    """

    _RACY_NS = 2_000_000_000  # a file modified less than this before a look may change again unseen

    def __init__(self, modules: Iterable[ModuleType | None] = (), *, ran: dict[str, Stamp] | None = None) -> None:
        self._ran: dict[str, Stamp] = dict(ran or {})
        self.add(modules)
        self._trusted: dict[str, tuple[int, int]] = {}  # file -> (mtime_ns, size) whose content is known
        self._told: dict[str, bytes | None] = {}  # file -> the content last reported as changed

    @property
    def files(self) -> list[str]:
        """The files watched."""
        return list(self._ran)

    def add(self, modules: Iterable[ModuleType | None]) -> None:
        """Watch the files of more modules, each run from a ``.py`` file (not ``__main__``: a
        notebook's cells, or the script being run). A file watched already takes what these
        modules ran: ``initialize`` loads the model file afresh when it changed (a module from
        an earlier harness of the dir, watched when the service was built, is not what runs)."""
        for module in modules:
            if module is None or module.__name__ == "__main__":
                continue
            stamp = stamp_of(module)
            if stamp is not None:  # (then its __file__ is a .py file)
                self._ran[module.__file__] = stamp  # type: ignore[index]

    def renewed(self, modules: Iterable[ModuleType | None]) -> Sources:
        """Sources of ``modules`` and of the files watched here, each taken as it is now."""
        now = {file: stamp for file in self._ran if (stamp := read_stamp(file)) is not None}
        renewed = Sources(ran=now)
        renewed._ran.update(Sources(modules)._ran)
        return renewed

    def changed(self) -> list[str]:
        """The files whose content is not what ran, each told once per change (edited again,
        told again; put back as it was, forgotten)."""
        wall = time.time_ns()
        news = []
        for file, ran in self._ran.items():
            try:
                stat = os.stat(file)
            except OSError:
                key = None
            else:
                key = (stat.st_mtime_ns, stat.st_size)
                if self._trusted.get(file) == key:
                    continue
            current = read_stamp(file) if key is not None else None
            digest = current.digest if current is not None else None
            if key is not None and wall - key[0] > self._RACY_NS:
                self._trusted[file] = key
            if digest == ran.digest:
                self._told.pop(file, None)
            elif file not in self._told or self._told[file] != digest:
                self._told[file] = digest
                news.append(file)
        return news

    def differ(self) -> list[str]:
        """Every file whose content is not what ran, read now (no waiting, nothing remembered)."""
        return [f for f, ran in self._ran.items() if (now := read_stamp(f)) is None or now.digest != ran.digest]


def exec_source(module: ModuleType, file: str) -> None:
    """Execute ``file``'s current source in ``module``, never a cached ``.pyc``, noting what ran.

    A bytecode cache is checked by mtime (whole seconds) and size, so a file rewritten within a
    second to the same size would run its old code: an edit-and-reload loop must not.
    """
    with open(file, "rb") as f:
        stat, data = os.fstat(f.fileno()), f.read()
    code = compile(importlib.util.decode_source(data), file, "exec", dont_inherit=True)
    note(module, stat, data)
    exec(code, module.__dict__)


def stale(module: ModuleType) -> bool:
    """Whether ``module``'s file no longer holds the source it ran (False without a source file)."""
    ran = stamp_of(module)
    now = read_stamp(module.__file__) if ran is not None else None  # type: ignore[arg-type]  # a .py file
    return ran is not None and (now is None or now.digest != ran.digest)


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """A model dir's ``.py`` files, compiled from their source every time (never a ``.pyc``: its
    whole-second mtime and size can match a file edited since), remembering what ran."""

    stamp: Stamp | None = None

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        with open(path, "rb") as f:
            stat, data = os.fstat(f.fileno()), f.read()
        code = self.source_to_code(data, path)
        self.stamp = _stamp(stat, data)
        if self.is_package(fullname):  # its submodules are the dir's too: found the same way
            use_source_finder(os.path.dirname(path))
        return code


_LOADERS = (
    (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    (_SourceLoader, importlib.machinery.SOURCE_SUFFIXES),
    (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
)


class _SourceFinder(importlib.machinery.FileFinder):
    """The finder of a model dir (and of its packages' folders): :class:`_SourceLoader` for ``.py``."""

    def __init__(self, path: str) -> None:
        super().__init__(path, *_LOADERS)


def use_source_finder(directory: str) -> None:
    """Make imports from ``directory`` (a ``sys.path`` entry or a package's ``__path__``) use
    :class:`_SourceLoader`: one dict lookup when they do already."""
    if type(sys.path_importer_cache.get(directory)) is not _SourceFinder:
        sys.path_importer_cache[directory] = _SourceFinder(directory)


# ----------------------------------------------------------------------------------------------
# When the code on disk does not load: where, and the fix


def compiled_at(exc: BaseException) -> tuple[str, int, str] | None:
    """``(file, line, source text)`` a ``SyntaxError`` names (its traceback is the compiler's
    caller, not the file); None for any other exception."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        text = exc.text if exc.text is not None else linecache.getline(exc.filename, exc.lineno)
        return exc.filename, exc.lineno, text.strip()
    return None


def failed_at(exc: BaseException, directory: str | None, file: str | None = None) -> tuple[str, int, str] | None:
    """``(file, line, source text)`` of where importing a model dir's file failed: a file that
    does not compile where its SyntaxError says, else the innermost frame of the traceback in
    ``directory`` (or in ``file``); None when none is there."""
    if (compiled := compiled_at(exc)) is not None:
        return compiled
    prefix = directory + os.sep if directory else None
    found = None
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name == file or (prefix is not None and os.path.realpath(name).startswith(prefix)):
            found = name, tb.tb_lineno
        tb = tb.tb_next
    if found is None:
        return None
    return found[0], found[1], linecache.getline(found[0], found[1]).strip()


#: The fix of a handler that imports TorchServe's ``ts`` where it is not installed.
TORCHSERVE_MISSING_FIX = (
    "pip install torchserve==0.12.0 (the TorchServe handlerkit follows), or import handlerkit's own "
    "equivalents, which need no TorchServe: `from handlerkit.handlers import BaseHandler` for "
    "ts.torch_handler.base_handler.BaseHandler, and hk.send_intermediate_predict_response "
    "(`import handlerkit as hk`) for ts.handler_utils.utils.send_intermediate_predict_response"
)


def torchserve_missing(exc: BaseException) -> bool:
    """Whether ``exc`` is an import of TorchServe's ``ts`` where it is not installed."""
    return isinstance(exc, ModuleNotFoundError) and exc.name == "ts"


def import_failure(exc: BaseException, directory: str | None, file: str | None = None) -> tuple[str, str | None]:
    """What the message of a failed import of a model dir's file adds after its first line: the
    file, line and source where it failed (and that TorchServe is not installed, when that is
    why); and the fix, when the cause has one of its own (a file that does not compile,
    TorchServe not installed), else None."""
    location = failed_at(exc, directory, file)
    lines = f"\n  at {location[0]}:{location[1]}: {location[2]}" if location is not None else ""
    if torchserve_missing(exc):
        return lines + "\nTorchServe (the ts package) is not installed here", TORCHSERVE_MISSING_FIX
    if isinstance(exc, SyntaxError) and location is not None:
        return lines, f"correct {os.path.basename(location[0])} line {location[1]}: Python cannot compile it"
    return lines, None
