"""Keep each model dir's modules to itself: several model dirs in one process.

TorchServe runs one worker process per model; a notebook holds several model dirs in one
process, and each may have its own ``model.py`` or ``handler.py``. Inside
``with model_dir_imports(model_dir):`` a bare ``import model`` (yours, or TorchServe's
``BaseHandler._load_pickled_model``) gets that dir's ``model.py``, never a ``model`` cached in
``sys.modules`` from elsewhere; the modules the dir provides are kept per dir, so the same
class objects come back each time the dir is entered, and are removed from ``sys.modules`` on
exit. Stdlib and installed modules that a model-dir file happens to shadow are left alone (as
in TorchServe's worker, which has imported them before the handler), with a warning.

**Fresh code.** A block that takes a fresh look (``max_age=0``: opening a model dir,
``initialize``, ``reload``) runs the files as they are on disk, as a new TorchServe worker
would: when one of the dir's cached modules no longer holds its file's content, the dir's whole
cache is forgotten, so the modules that imported it run again too (simpler and safer than
tracking who imported what). :mod:`handlerkit.worker.freshness` compiles the files from source.

:func:`load_module_from_file` imports a model dir's file under a name unique to its dir, and
:func:`exec_source` runs a file's current source (never stale bytecode) for ``Harness.reload``.
The Harness enters a block on every run, so entering and leaving are kept to a few dict
operations and no syscall (see ``max_age``); file contents are read only by fresh looks.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import site
import sys
import sysconfig
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitWarning, HandlerLoadError
from handlerkit.worker.freshness import exec_source, import_failure, stale, stamp_of, use_source_finder

__all__ = ["clear_module_cache", "dir_modules", "exec_source", "load_module_from_file", "model_dir_imports"]

_UNIQUE_PREFIX = "handlerkit_modeldir_"


_lock = threading.RLock()
_listings: dict[str, tuple[int, frozenset[str], float]] = {}  # dir -> (mtime_ns, module names, checked at)
_caches: dict[str, dict[str, ModuleType]] = {}  # dir -> {sys.modules key: module imported from it}
_owned: dict[int, str] = {}  # id(module) -> dir, for every module in _caches
_adopted: set[int] = set()  # ids of cached modules that also stay in sys.modules between blocks
_active: list[str] = []  # the dirs of the open model_dir_imports blocks, innermost last
_warned_shadows: set[tuple[str, str]] = set()
_generations: dict[str, int] = {}  # dir -> how many times its cache was forgotten for a changed file
# a module load_module_from_file loaded -> (the dir whose imports it saw, that dir's generation then)
_built_with: weakref.WeakKeyDictionary[ModuleType, tuple[str, int]] = weakref.WeakKeyDictionary()


def dir_modules(model_dir: str | None) -> list[ModuleType]:
    """The modules imported from ``model_dir`` in its blocks, and those :func:`load_module_from_file`
    loaded with its imports (handlerkit's BaseHandler loads the modelFile so)."""
    with _lock:
        loaded = [m for m, (d, _) in list(_built_with.items()) if d == model_dir and sys.modules.get(m.__name__) is m]
        return [*_caches.get(model_dir, {}).values(), *loaded] if model_dir is not None else []


@dataclass(slots=True)
class _Entered:
    names: frozenset[str]
    saved: dict[str, Any]  # modules set aside (a sys.modules value may be None)
    present: set[str]  # keys of this dir's modules that were in sys.modules already
    module_count: int = 0  # len(sys.modules) once entered: unchanged at exit means nothing was imported


@functools.lru_cache(maxsize=512)
def _realdir(path: str) -> str:
    return os.path.realpath(path)


def _normdir(model_dir: str | os.PathLike[str]) -> str:
    if isinstance(model_dir, str) and model_dir.startswith(os.sep):
        return _normabs(model_dir)  # the Harness enters its (absolute) dir on every run
    return _realdir(os.path.abspath(os.fspath(model_dir)))


@functools.lru_cache(maxsize=512)
def _normabs(path: str) -> str:
    return _realdir(os.path.abspath(path))


def _provided(model_dir: str, max_age: float = 0.0) -> frozenset[str]:
    """Top-level module names the dir provides (``*.py`` files and sub-directories).

    Cached; listed again when the directory's mtime changes (a file added, removed or renamed).
    The mtime is checked on every call, or, with ``max_age`` seconds, only when the last check
    is older than that.
    """
    entry = _listings.get(model_dir)
    now = time.monotonic()
    if entry is not None and max_age > 0 and now - entry[2] < max_age:
        return entry[1]
    mtime = os.stat(model_dir).st_mtime_ns
    if entry is not None and entry[0] == mtime:
        _listings[model_dir] = (mtime, entry[1], now)
        return entry[1]
    names: set[str] = set()
    with os.scandir(model_dir) as it:
        for item in it:
            if item.name.endswith(".py") and item.is_file():
                if item.name[:-3].isidentifier():
                    names.add(item.name[:-3])
            elif item.name.isidentifier() and item.name != "__pycache__" and item.is_dir():
                names.add(item.name)
    if entry is not None:
        # The directory changed: make sure the import system sees it (mtime granularity).
        finder = sys.path_importer_cache.get(model_dir)
        if finder is not None and hasattr(finder, "invalidate_caches"):
            finder.invalidate_caches()
    listing = frozenset(names)
    _listings[model_dir] = (mtime, listing, now)
    return listing


def _belongs(module: Any, model_dir: str, key: str | None = None) -> bool:
    """Whether `module` (``sys.modules[key]``) is ``<model_dir>/<top-level name>.py`` or lives
    in ``<model_dir>/<top-level name>/`` (a module of a nested model dir does not count)."""
    owner = _owned.get(id(module))
    if owner is not None:
        return owner == model_dir
    top = (key or getattr(module, "__name__", None) or "").partition(".")[0]
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        locations = [file]
    else:
        try:
            locations = [p for p in getattr(module, "__path__", None) or () if isinstance(p, str)]
        except Exception:
            return False
    prefix = model_dir + os.sep
    for location in locations:
        absolute = os.path.abspath(location)
        for path in (absolute, os.path.realpath(absolute)):
            if path.startswith(prefix) and path[len(prefix) :].split(os.sep, 1)[0].partition(".")[0] == top:
                return True
    return False


@functools.lru_cache(maxsize=1)
def _installed_prefixes() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    with contextlib.suppress(Exception):
        paths.update(site.getsitepackages())
    with contextlib.suppress(Exception):
        paths.add(site.getusersitepackages())
    return tuple(os.path.realpath(p) + os.sep for p in paths if p)


def _is_installed(module: Any) -> bool:
    """Built-in, frozen, stdlib or site-packages: what TorchServe's worker would already hold."""
    if getattr(module, "__name__", None) in sys.builtin_module_names:
        return True
    if getattr(getattr(module, "__spec__", None), "origin", None) in ("built-in", "frozen"):
        return True
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and os.path.realpath(file).startswith(_installed_prefixes())


def _keys(names: frozenset[str]) -> list[str]:
    """The sys.modules keys of these top-level names and, for packages, their submodules.

    Submodules are found through the attributes the import system binds on their package
    (``pkg.sub``), not by scanning ``sys.modules``, which holds thousands of keys once torch is in.
    """
    keys: list[str] = []
    stack = [n for n in names if n in sys.modules]
    while stack:
        key = stack.pop()
        keys.append(key)
        module = sys.modules.get(key)
        if "__path__" not in getattr(module, "__dict__", ()):  # not a package (and no raise inside hasattr)
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, ModuleType):
                sub = f"{key}.{attr}"
                if sys.modules.get(sub) is value:
                    stack.append(sub)
    return keys


def _any_imported(names: frozenset[str]) -> bool:
    modules = sys.modules
    for name in names:
        if name in modules:
            return True
    return False


def _enter(model_dir: str, max_age: float = 0.0) -> _Entered:
    names = _provided(model_dir, max_age)
    # A fresh look (open, initialize, reload; never a run): are the dir's modules what its files hold?
    if max_age <= 0 and model_dir not in _active and any(map(stale, _caches.get(model_dir, {}).values())):
        _forget(model_dir)  # a file changed: every module of the dir runs afresh in this block
        _generations[model_dir] = _generations.get(model_dir, 0) + 1
    use_source_finder(model_dir)
    cache = _caches.setdefault(model_dir, {})
    saved: dict[str, Any] = {}
    present: set[str] = set()
    modules = sys.modules
    # Usually no name of the dir is imported outside a block: nothing to set aside or adopt.
    for key in _keys(names) if _any_imported(names) else ():
        module = sys.modules.get(key)
        if module is not None and _belongs(module, model_dir, key):
            present.add(key)
            _remember(model_dir, cache, key, module)
            _adopted.add(id(module))
        elif module is not None and id(module) not in _owned and _is_installed(module):
            _warn_shadow(model_dir, key, module)
        else:
            saved[key] = sys.modules.pop(key)
            # Imported in an enclosing block of another dir: cache it there now, so that dir
            # gets the very same module if it is entered again inside this block.
            for outer in reversed(_active):
                if module is not None and _belongs(module, outer, key):
                    _remember(outer, _caches.setdefault(outer, {}), key, module)
                    break
    for key, module in cache.items() if cache else ():
        if key not in modules and key.partition(".")[0] in names:
            modules[key] = module
    sys.path.insert(0, model_dir)
    _active.append(model_dir)
    return _Entered(names, saved, present, len(sys.modules))


def _exit(model_dir: str, state: _Entered) -> None:
    _active.pop()
    if sys.path and sys.path[0] == model_dir:
        del sys.path[0]
    else:
        with contextlib.suppress(ValueError):
            sys.path.remove(model_dir)
    if len(sys.modules) == state.module_count:
        names = state.names  # nothing was imported in the block: no file added since can matter
    else:
        try:
            names = _provided(model_dir)  # a file added inside the block may have been imported
        except OSError:  # the dir was removed inside the block
            names = frozenset()
    if names is not state.names:
        names = names | state.names
    if not _any_imported(names):
        if state.saved:
            sys.modules.update(state.saved)
        return
    cache = _caches.setdefault(model_dir, {})
    for key in _keys(names):
        module = sys.modules.get(key)
        if module is not None and _belongs(module, model_dir, key):
            _remember(model_dir, cache, key, module)
            # What was imported before the block (and submodules of such packages, e.g. a
            # project's own package when the model dir is the project root) stays imported.
            if key not in state.present and key.partition(".")[0] not in state.present:
                del sys.modules[key]
            else:
                _adopted.add(id(module))
    if state.saved:
        sys.modules.update(state.saved)


def _remember(model_dir: str, cache: dict[str, ModuleType], key: str, module: ModuleType) -> None:
    old = cache.get(key)
    if old is not module:
        if old is not None:
            _owned.pop(id(old), None)
            _adopted.discard(id(old))
        cache[key] = module
        _owned[id(module)] = model_dir
        stamp_of(module)  # what it ran, noted now for a module imported some other way


def _forget(directory: str) -> None:
    """Drop the dir's cached modules (and those :func:`load_module_from_file` loaded from it)
    from the cache and ``sys.modules``; modules imported outside any block stay imported."""
    for key, module in _caches.pop(directory, {}).items():
        _owned.pop(id(module), None)
        if id(module) in _adopted:
            _adopted.discard(id(module))
        elif sys.modules.get(key) is module:
            del sys.modules[key]
    _listings.pop(directory, None)
    package = _unique_package(directory)
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]


def _warn_shadow(model_dir: str, key: str, module: Any) -> None:
    if "." in key or (model_dir, key) in _warned_shadows:
        return
    _warned_shadows.add((model_dir, key))
    warnings.warn(
        f"handlerkit: the model dir {model_dir} has {key}.py (or {key}/), but {key!r} is already imported "
        f"from {getattr(module, '__file__', None) or 'the standard library'}; imports of {key!r} get that "
        f"module, not your file (so does TorchServe's worker once it has imported it). Rename your {key}",
        HandlerkitWarning,
        stacklevel=user_stacklevel(),
    )


def model_dir_imports(model_dir: str | os.PathLike[str] | None, *, max_age: float = 0.0) -> _DirImports:
    """Run a block with `model_dir`'s own modules, as if in TorchServe's one-model worker.

    Inside the block `model_dir` is first on ``sys.path``; every top-level name the dir provides
    (``*.py`` files and sub-directories) resolves to the dir's module: a module of that name
    from elsewhere (another model dir, the notebook's directory) is set aside, and the dir's
    modules imported in an earlier block come back (same module and class objects). On exit the
    dir's modules leave ``sys.modules`` (kept in a per-dir cache) and what was set aside returns.
    Re-entering the innermost dir is a no-op, so blocks nest freely; a block for another dir
    inside swaps in turn. Stdlib and installed modules are never set aside (a file that shadows
    one gets a warning). ``sys.modules`` is process-wide: do not hold blocks for different dirs
    in several threads at once.

    With ``max_age=0`` the dir's modules run its files as they are on disk: when one of its
    cached modules no longer holds its file's content, the whole cache is forgotten and the
    block imports the dir's modules afresh (modules imported outside any block are left alone).

    Entering costs one ``stat`` of the dir, to notice files added since the last block, and
    with ``max_age=0`` a read of each file the dir's modules came from; leaving costs none
    unless something was imported inside the block.

    Args:
        model_dir: the model dir; None makes the block a no-op.
        max_age: trust the dir's cached listing when it was checked less than this many seconds
            ago, saving the ``stat``, and trust the cached modules (the Harness passes 1 s for
            its runs: a syscall costs several microseconds between two bursts of torch work; its
            open, ``initialize`` and ``reload`` pass 0). A file added meanwhile matters only if
            its name is also imported from outside the dir; it is seen once the age passes.

    Returns:
        A context manager whose ``with ... as`` value is the real path of the model dir (None
        for None).

    Raises:
        FileNotFoundError: on entry, when model_dir does not exist.
    """
    return _DirImports(model_dir, max_age)


class _DirImports:
    """The context manager :func:`model_dir_imports` returns (a class, not a generator: the
    Harness enters one per run, so entering and leaving are kept to a few operations)."""

    __slots__ = ("_directory", "_max_age", "_model_dir", "_normalized", "_state")

    def __init__(self, model_dir: str | os.PathLike[str] | None, max_age: float = 0.0) -> None:
        self._model_dir = model_dir
        self._max_age = max_age
        self._normalized: str | None = None  # the real path, found on first entry (the dir may not exist yet)
        self._directory: str | None = None
        self._state: _Entered | None = None

    def __enter__(self) -> str | None:
        if self._model_dir is None:
            return None
        directory = self._normalized
        if directory is None:
            directory = self._normalized = _normdir(self._model_dir)
        with _lock:
            if _active and _active[-1] == directory:
                _active.append(directory)
                state = None
            else:
                try:
                    state = _enter(directory, self._max_age)
                except FileNotFoundError as exc:
                    raise FileNotFoundError(f"model dir {os.fspath(self._model_dir)!r} does not exist") from exc
        self._directory, self._state = directory, state
        return directory

    def __exit__(self, *exc_info: object) -> None:
        directory = self._directory
        if directory is None:
            return
        state, self._directory, self._state = self._state, None, None
        with _lock:
            if state is None:
                _active.pop()
            else:
                _exit(directory, state)


def clear_module_cache(model_dir: str | os.PathLike[str] | None = None) -> None:
    """Forget the modules imported from `model_dir` (all dirs when None).

    The next import within a block re-executes the files. A block with ``max_age=0`` does this by
    itself when a file changed; this forces it. Modules loaded with
    :func:`load_module_from_file` from that dir are dropped too. Modules that were imported
    outside any block (e.g. your project's package when the model dir is the project root) stay
    in ``sys.modules``.
    """
    with _lock:
        dirs = [_normdir(model_dir)] if model_dir is not None else list(_caches)
        for directory in dirs:
            _forget(directory)


def _unique_package(directory: str) -> str:
    return _UNIQUE_PREFIX + hashlib.sha1(directory.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _ensure_package(package: str, directory: str) -> ModuleType:
    existing = sys.modules.get(package)
    if existing is not None:
        return existing
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = [directory]
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    return module


def load_module_from_file(
    path: str | os.PathLike[str],
    module_name: str | None = None,
    *,
    import_dir: str | os.PathLike[str] | None = None,
    reload: bool = False,
) -> ModuleType:
    """Import a ``.py`` file under a name no other file shares.

    The default name is ``handlerkit_modeldir_<hash of the dir>.<stem>``, registered in
    ``sys.modules`` (with a parent package whose ``__path__`` is the dir), so two dirs' ``model.py``
    never collide, ``cls.__module__ == module.__name__`` holds for its classes, and pickling and
    ``inspect.getsource`` work. The file runs inside :func:`model_dir_imports` of its dir (or of
    `import_dir`), so its own bare imports resolve there. Loading the same file again returns
    the same module unless `reload`, or unless the file changed since it ran (by content), or a
    module of the import dir that it may have imported did.

    Args:
        path: the file.
        module_name: the name to register (a dotted name needs an importable parent).
        import_dir: the dir whose imports the file sees; its own dir by default.
        reload: execute the file again even if it is loaded.

    Returns:
        The module.

    Raises:
        FileNotFoundError: no such file.
        HandlerLoadError: executing the file raised (the real error is chained; a file that
            does not compile is named with its line and source).
    """
    file = os.path.realpath(os.fspath(path))
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no such file: {os.fspath(path)!r}")
    directory = os.path.dirname(file)
    stem = os.path.splitext(os.path.basename(file))[0]
    package = None
    if module_name is None:
        package = _unique_package(directory)
        module_name = f"{package}.{stem}"
    imports = _normdir(import_dir if import_dir is not None else directory)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise HandlerLoadError(
            f"{file} cannot be imported as a Python module: no import loader handles its extension",
            fix="give a Python source file (.py)",
        )
    # A fresh look at its import dir: when a module there changed, the generation moves on.
    with model_dir_imports(imports):
        with _lock:
            existing = sys.modules.get(module_name)
            if existing is not None and not reload and getattr(existing, "__file__", None) == file:
                if not stale(existing) and _built_with.get(existing) == (imports, _generations.get(imports, 0)):
                    return existing  # (and what it imported from the dir holds too)
            if package is not None:
                _ensure_package(package, directory)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            exec_source(module, file)
        except Exception as exc:
            if existing is not None:
                sys.modules[module_name] = existing
            else:
                sys.modules.pop(module_name, None)
            lines, fix = import_failure(exc, imports, file)
            raise HandlerLoadError(
                f"importing {file} failed: {type(exc).__name__}: {exc}{lines}",
                fix=fix or f"correct {os.path.basename(file)} (it runs with {imports} first on sys.path)",
            ) from exc
        _built_with[module] = (imports, _generations.get(imports, 0))
    if package is not None:
        setattr(sys.modules[package], stem, module)
    return module
