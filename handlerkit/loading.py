"""Find a handler the way TorchServe 0.12 does, and keep each model dir's modules to itself.

**Handler specs** (``ts/model_loader.py``): ``name``, ``name.py``, ``path/to/name.py``,
``file.py:function``, ``name:function`` or a dotted module path. The module is imported with
the model dir first on ``sys.path``. A module attribute named ``handle`` (or the function named
after ``:``) is a function entry point, initialised by ``handle(None, context)``; otherwise the
module must define exactly one class (``cls.__module__ == module.__name__``), which is built
with no arguments and must have ``handle``.

Where handlerkit differs, it is to show what TorchServe hides:

- when the handler module exists but fails to import, TorchServe swallows the ImportError and
  retries the name as ``ts.torch_handler.<name>``, so the user sees "No module named
  'ts.torch_handler.<name>'". handlerkit raises :class:`~handlerkit.errors.HandlerLoadError`
  naming the file and quoting the real error;
- a bare name that is no module at all falls back to handlerkit's built-ins
  (``handlerkit.handlers.<name>``) and then, when torchserve is installed, to TorchServe's
  (``ts.torch_handler.<name>``), so a manifest naming ``text_handler`` gets what the server
  would run. A dotted path (``ts.torch_handler.image_classifier``) picks one explicitly;
- ``file.py:function`` naming a function the module lacks is an error (TorchServe silently
  falls back to the module's class).

**Import isolation.** TorchServe runs one worker process per model; a notebook holds several
model dirs in one process, and each may have its own ``model.py`` or ``handler.py``. Inside
``with model_dir_imports(model_dir):`` a bare ``import model`` (yours, or TorchServe's
``BaseHandler._load_pickled_model``) gets that dir's ``model.py``, never a ``model`` cached in
``sys.modules`` from elsewhere; the modules the dir provides are kept per dir, so the same
class objects come back each time the dir is entered, and are removed from ``sys.modules`` on
exit. Stdlib and installed modules that a model-dir file happens to shadow are left alone (as
in TorchServe's worker, which has imported them before the handler), with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import pkgutil
import site
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from handlerkit.errors import HandlerkitWarning, HandlerLoadError

__all__ = [
    "BUILTIN_PACKAGES",
    "ResolvedHandler",
    "clear_module_cache",
    "list_classes",
    "load_module_from_file",
    "model_dir_imports",
    "resolve_handler",
]

#: Packages searched, in order, for a bare handler name that is no module of its own.
BUILTIN_PACKAGES: tuple[str, ...] = ("handlerkit.handlers", "ts.torch_handler")
_BUILTIN_ORIGINS = {"handlerkit.handlers": "handlerkit", "ts.torch_handler": "torchserve"}
_UNIQUE_PREFIX = "handlerkit_modeldir_"

Origin = Literal["model_dir", "file", "sys.path", "handlerkit", "torchserve"]


# ----------------------------------------------------------------------------------------------
# Resolution


@dataclass(repr=False)
class ResolvedHandler:
    """A handler found from a spec string, ready to initialise.

    Attributes:
        spec: the spec as given.
        kind: ``"class"`` (an instance of the module's one class) or ``"function"``.
        module: the imported module.
        module_file: its file, when it has one.
        cls: the handler class (None for a function handler).
        instance: the handler instance, built with no arguments (None for a function handler).
        function: the entry point: ``instance.handle`` or the module-level function.
        function_name: ``"handle"`` or the name after ``:`` in the spec.
        model_dir: the dir whose imports the handler sees (wrap calls in
            :func:`model_dir_imports` of it; :meth:`initialize` and :meth:`handle` do).
        origin: where the module came from: ``"model_dir"``, ``"file"`` (a file outside the
            model dir, loaded as if archived into it), ``"sys.path"``, ``"handlerkit"`` or
            ``"torchserve"`` (a built-in handler).
    """

    spec: str
    kind: Literal["class", "function"]
    module: ModuleType
    module_file: str | None
    cls: type | None
    instance: Any | None
    function: Callable[..., Any]
    function_name: str
    model_dir: str | None
    origin: Origin = "sys.path"

    def initialize(self, context: Any) -> None:
        """Run TorchServe's initialisation: ``handle(None, context)`` for a function handler,
        ``instance.initialize(context)`` for a class (skipped when it has none)."""
        with model_dir_imports(self.model_dir):
            if self.kind == "function":
                self.function(None, context)
            elif hasattr(self.instance, "initialize"):
                self.instance.initialize(context)

    def handle(self, data: Any, context: Any) -> Any:
        """Call the entry point within the model dir's imports."""
        with model_dir_imports(self.model_dir):
            return self.function(data, context)

    def imports(self) -> contextlib.AbstractContextManager[str | None]:
        """``model_dir_imports(self.model_dir)``."""
        return model_dir_imports(self.model_dir)

    def __repr__(self) -> str:
        what = f"class {self.cls.__name__}" if self.cls is not None else f"function {self.function_name}"
        where = self.module_file or self.module.__name__
        return f"ResolvedHandler({self.spec!r} -> {what} in {where}, origin={self.origin!r})"


def resolve_handler(
    spec: str, model_dir: str | os.PathLike[str] | None = None, *, reload: bool = False
) -> ResolvedHandler:
    """Resolve a TorchServe handler spec to an entry point (TorchServe 0.12's model loader rules).

    Args:
        spec: ``name``, ``name.py``, ``path/to/name.py``, ``file.py:function``,
            ``name:function`` or a dotted module path such as
            ``ts.torch_handler.image_classifier``.
        model_dir: the model dir; modules are imported with it first on ``sys.path`` and
            isolated from other dirs (see :func:`model_dir_imports`). A ``path/to/name.py``
            outside it is loaded as if archived into it.
        reload: forget the model dir's cached modules first, so edited files are re-imported
            (class objects change).

    Returns:
        The resolved handler; a class handler is already instantiated, not initialised.

    Raises:
        HandlerLoadError: not found (the message lists where handlerkit looked), the module
            fails to import (the real error, chained), or it breaks TorchServe's rules (several
            classes, no class, no ``handle``, a constructor that needs arguments).
        TypeError: spec is not a string.
        ValueError: spec is empty.
        NotADirectoryError: model_dir is not a directory.
    """
    if not isinstance(spec, str):
        raise TypeError(f"handler spec must be a string, got {type(spec).__name__} {spec!r}")
    text = spec.strip()
    if not text:
        raise ValueError("handler spec is empty; give e.g. 'handler.py', 'handler.py:handle' or 'image_classifier'")
    mdir = _normdir(model_dir) if model_dir is not None else None
    if mdir is not None and not os.path.isdir(mdir):
        raise NotADirectoryError(f"model dir {os.fspath(model_dir)!r} is not a directory")  # type: ignore[arg-type]
    if reload and mdir is not None:
        clear_module_cache(mdir)

    module_part, _, function_part = text.partition(":")  # TorchServe: handler.split(":", 1)
    function_name = function_part or None
    if _is_file_spec(module_part):
        module, scope, origin = _import_file_spec(text, module_part, mdir)
    else:
        module, origin = _import_module_spec(text, module_part, mdir)
        scope = mdir
    return _entry_point(text, module_part, module, function_name, scope, origin)


def list_classes(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """The classes defined in `module` (``cls.__module__ == module.__name__``), sorted by name.

    This is TorchServe's ``list_classes_from_module``: classes imported into the module do not
    count. With `parent_class`, only its subclasses.
    """
    classes = [
        member
        for _, member in inspect.getmembers(module, inspect.isclass)
        if member.__module__ == module.__name__
    ]
    if parent_class is not None:
        classes = [c for c in classes if issubclass(c, parent_class)]
    return classes


def _is_file_spec(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def _import_file_spec(spec: str, module_part: str, mdir: str | None) -> tuple[ModuleType, str, Origin]:
    rel = os.path.expanduser(module_part if module_part.endswith(".py") else module_part + ".py")
    candidates: list[str] = []
    if os.path.isabs(rel):
        candidates.append(rel)
    else:
        if mdir is not None:
            candidates.append(os.path.join(mdir, rel))
        candidates.append(os.path.abspath(rel))
        if mdir is not None and os.path.basename(rel) != rel:
            # TorchServe imports only the basename: the archiver flattened the file into the dir.
            candidates.append(os.path.join(mdir, os.path.basename(rel)))
    found = next((c for c in candidates if os.path.isfile(c)), None)
    if found is None:
        looked = "\n".join(f"  - {c}" for c in dict.fromkeys(candidates))
        raise HandlerLoadError(
            f"handler {spec!r}: no such file. Looked for:\n{looked}\n"
            f"Fix: check the path (relative paths are tried in the model dir, then in the current directory)"
        )
    found = os.path.realpath(found)
    fdir, stem = os.path.dirname(found), os.path.basename(found)[:-3]
    if mdir is not None and fdir != mdir:
        module = load_module_from_file(found, import_dir=mdir)
        return module, mdir, "file"
    if not stem.isidentifier():
        raise HandlerLoadError(
            f"handler {spec!r}: {found} cannot be imported: TorchServe imports the handler by its file "
            f"name and {stem!r} is not a valid module name. Fix: rename it to "
            f"{_identifier(stem)}.py"
        )
    module = _import_by_name(spec, stem, fdir)
    if module is None:  # pragma: no cover - the file exists, so only a race gets here
        raise HandlerLoadError(f"handler {spec!r}: {found} vanished while importing it")
    return module, fdir, "model_dir"


def _import_module_spec(spec: str, name: str, mdir: str | None) -> tuple[ModuleType, Origin]:
    if not all(part.isidentifier() for part in name.split(".")):
        raise HandlerLoadError(
            f"handler {spec!r}: {name!r} is not a module name. Write name, name.py, path/to/name.py, "
            f"file.py:function or a dotted module path (e.g. ts.torch_handler.image_classifier)"
        )
    module = _import_by_name(spec, name, mdir)
    if module is not None and getattr(module, "__file__", None) is None:
        # A namespace package: a plain folder of that name on sys.path (say a model dir
        # called image_classifier/ beside the notebook). It holds no handler code.
        module = None
    if module is not None:
        if mdir is not None and _belongs(module, mdir):
            return module, "model_dir"
        return module, ("torchserve" if name.startswith("ts.torch_handler.") else "sys.path")
    if "." not in name:
        for package in BUILTIN_PACKAGES:
            if package == "ts.torch_handler" and not _torchserve_installed():
                continue
            module = _import_by_name(spec, f"{package}.{name}", None, builtin=True)
            if module is not None:
                return module, _BUILTIN_ORIGINS[package]  # type: ignore[return-value]
    raise HandlerLoadError(_not_found_message(spec, name, mdir))


def _import_by_name(spec: str, name: str, scope: str | None, *, builtin: bool = False) -> ModuleType | None:
    """Import `name` within `scope`'s imports; None when no such module exists at all."""
    with model_dir_imports(scope):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if _is_missing(exc, name):
                return None
            raise _import_failed(spec, name, scope, exc, builtin) from exc
        except Exception as exc:
            raise _import_failed(spec, name, scope, exc, builtin) from exc


def _is_missing(exc: ModuleNotFoundError, name: str) -> bool:
    """Whether `exc` says `name` itself (or a parent package of it) does not exist."""
    missing = exc.name
    return bool(missing) and (name == missing or name.startswith(f"{missing}."))


def _import_failed(spec: str, name: str, scope: str | None, exc: BaseException, builtin: bool) -> HandlerLoadError:
    file = _module_origin(name, scope)
    where = f" ({file})" if file else ""
    message = f"handler {spec!r}: importing module {name!r}{where} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, ImportError) and not builtin:
        first = spec.split(".")[0]
        hidden = f"ts.torch_handler.{first}"
        message += (
            f"\nTorchServe 0.12 would have hidden this error behind \"No module named {hidden!r}\" "
            f"(when a handler fails to import it retries the name as one of its built-in handlers)"
        )
        if first in _torchserve_builtin_names():
            message += f", and would have silently served its own {hidden} instead"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        message += (
            f"\nFix: if {exc.name!r} is a package, pip install it (and list it in the archive's "
            f"requirements file); if it is one of your files, put it in the model dir "
            f"(torch-model-archiver --extra-files)"
        )
    else:
        message += f"\nFix: correct the error above in {file or name}"
    return HandlerLoadError(message)


def _module_origin(name: str, scope: str | None) -> str | None:
    try:
        with model_dir_imports(scope):
            found = importlib.util.find_spec(name)
    except Exception:
        return None
    return found.origin if found is not None and found.has_location else None


def _not_found_message(spec: str, name: str, mdir: str | None) -> str:
    looked = []
    if mdir is not None:
        looked.append(f"module {name!r} in the model dir {mdir} ({name.replace('.', '/')}.py or package), then on sys.path")
    else:
        looked.append(f"module {name!r} on sys.path (no model dir given)")
    candidates: list[str] = list(_provided(mdir)) if mdir is not None else []
    if "." not in name:
        looked.append(f"handlerkit's built-in handlerkit.handlers.{name}")
        candidates += _builtin_names("handlerkit.handlers")
        if _torchserve_installed():
            looked.append(f"TorchServe's built-in ts.torch_handler.{name}")
            candidates += _torchserve_builtin_names()
        else:
            looked.append("TorchServe's built-ins were not searched: torchserve is not installed")
    near = _nearest(name, candidates)
    hint = f"did you mean {near!r}? Otherwise check" if near else "check"
    listing = "\n".join(f"  - {line}" for line in looked)
    return (
        f"handler {spec!r} not found. Looked for:\n{listing}\n"
        f"Fix: {hint} the spelling, or put {name.split('.')[-1]}.py in the model dir "
        f"(torch-model-archiver --handler {name.split('.')[-1]}.py)"
    )


def _nearest(name: str, candidates: list[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.75)
    return match[0] if match else None


def _entry_point(
    spec: str,
    module_part: str,
    module: ModuleType,
    function_name: str | None,
    scope: str | None,
    origin: Origin,
) -> ResolvedHandler:
    name = function_name or "handle"
    module_file = getattr(module, "__file__", None)
    label = f"module {module.__name__}" + (f" ({module_file})" if module_file else "")
    if hasattr(module, name):
        function = getattr(module, name)
        if not callable(function):
            raise HandlerLoadError(
                f"handler {spec!r}: {label} has {name} = {type(function).__name__}, not a function; "
                f"TorchServe calls {name}(data, context). Fix: define def {name}(data, context): ..."
            )
        return ResolvedHandler(spec, "function", module, module_file, None, None, function, name, scope, origin)
    if function_name is not None:
        functions = [n for n, f in inspect.getmembers(module, inspect.isfunction) if f.__module__ == module.__name__]
        raise HandlerLoadError(
            f"handler {spec!r}: {label} has no function {function_name!r} "
            f"(functions defined there: {', '.join(functions) or 'none'}). TorchServe 0.12 would silently "
            f"fall back to the module's class. Fix: correct the name after ':' or drop ':{function_name}' "
            f"to use the class"
        )
    classes = list_classes(module)
    suggestion = f"{module_part}:handle"
    if len(classes) > 1:
        names = ", ".join(c.__name__ for c in classes)
        raise HandlerLoadError(
            f"handler {spec!r}: {label} defines {len(classes)} classes ({names}) and no function 'handle'; "
            f"TorchServe needs exactly one class or a function entry point (it raises \"Expected only one "
            f"class in custom service code or a function entry point\"). Fix: keep one class in the module "
            f"(move helpers to another file) or name the function: {suggestion!r}"
        )
    if not classes:
        imported = [
            n for n, c in inspect.getmembers(module, inspect.isclass) if hasattr(c, "handle") and c.__module__ != module.__name__
        ]
        hint = (
            f" Classes imported from elsewhere do not count (TorchServe checks cls.__module__): to use "
            f"{imported[0]}, subclass it here: class MyHandler({imported[0]}): pass."
            if imported
            else ""
        )
        raise HandlerLoadError(
            f"handler {spec!r}: {label} defines no class and no function 'handle'; TorchServe needs one "
            f"handler class or a function handle(data, context).{hint} Fix: define a handler class (e.g. "
            f"subclass handlerkit.BaseHandler) or def handle(data, context): ..."
        )
    cls = classes[0]
    try:
        with model_dir_imports(scope):
            instance = cls()
    except Exception as exc:
        raise HandlerLoadError(
            f"handler {spec!r}: TorchServe builds the handler with {cls.__name__}() (no arguments), and that "
            f"raised {type(exc).__name__}: {exc}. Fix: give every __init__ argument a default, or move the "
            f"setup into initialize(self, context)"
        ) from exc
    if not hasattr(instance, "handle"):
        raise HandlerLoadError(
            f"handler {spec!r}: class {cls.__name__} in {label} has no handle method; TorchServe calls "
            f"instance.handle(data, context). Fix: subclass handlerkit.BaseHandler (or TorchServe's), or "
            f"define def handle(self, data, context): ..."
        )
    if not hasattr(instance, "initialize"):
        warnings.warn(
            f"handlerkit: handler class {cls.__name__} has no initialize method; TorchServe 0.12 fails to "
            f"load it (AttributeError: 'initialize'). Add def initialize(self, context): ...",
            HandlerkitWarning,
            stacklevel=3,
        )
    return ResolvedHandler(spec, "class", module, module_file, cls, instance, instance.handle, "handle", scope, origin)


def _identifier(stem: str) -> str:
    text = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in stem)
    return text if text and not text[0].isdigit() else f"_{text}"


@functools.lru_cache(maxsize=1)
def _torchserve_installed() -> bool:
    return importlib.util.find_spec("ts") is not None


def _builtin_names(package: str) -> list[str]:
    try:
        found = importlib.util.find_spec(package)
    except Exception:
        return []
    if found is None or not found.submodule_search_locations:
        return []
    return [m.name for m in pkgutil.iter_modules(list(found.submodule_search_locations)) if not m.name.startswith("_")]


@functools.lru_cache(maxsize=1)
def _torchserve_builtin_names() -> tuple[str, ...]:
    if not _torchserve_installed():
        return ()
    found = importlib.util.find_spec("ts")
    locations = list(found.submodule_search_locations or ()) if found is not None else []
    paths = [os.path.join(loc, "torch_handler") for loc in locations]
    return tuple(m.name for m in pkgutil.iter_modules(paths) if not m.name.startswith("_") and m.name != "unit_tests")


# ----------------------------------------------------------------------------------------------
# Import isolation

_lock = threading.RLock()
_listings: dict[str, tuple[int, frozenset[str], float]] = {}  # dir -> (mtime_ns, module names, checked at)
_caches: dict[str, dict[str, ModuleType]] = {}  # dir -> {sys.modules key: module imported from it}
_owned: dict[int, str] = {}  # id(module) -> dir, for every module in _caches
_adopted: set[int] = set()  # ids of cached modules that also stay in sys.modules between blocks
_active: list[str] = []  # the dirs of the open model_dir_imports blocks, innermost last
_warned_shadows: set[tuple[str, str]] = set()


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
    paths = set(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib"))
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


def _warn_shadow(model_dir: str, key: str, module: Any) -> None:
    if "." in key or (model_dir, key) in _warned_shadows:
        return
    _warned_shadows.add((model_dir, key))
    warnings.warn(
        f"handlerkit: the model dir {model_dir} has {key}.py (or {key}/), but {key!r} is already imported "
        f"from {getattr(module, '__file__', None) or 'the standard library'}; imports of {key!r} get that "
        f"module, not your file (so does TorchServe's worker once it has imported it). Rename your {key}",
        HandlerkitWarning,
        stacklevel=5,
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

    Entering costs one ``stat`` of the dir, to notice files added since the last block; leaving
    costs none unless something was imported inside the block.

    Args:
        model_dir: the model dir; None makes the block a no-op.
        max_age: trust the dir's cached listing when it was checked less than this many seconds
            ago, saving the ``stat`` (the Harness passes 1 s for its runs: a syscall costs several
            microseconds between two bursts of torch work). A file added meanwhile matters only
            if its name is also imported from outside the dir; it is seen once the age passes.

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

    __slots__ = ("_directory", "_max_age", "_model_dir", "_state")

    def __init__(self, model_dir: str | os.PathLike[str] | None, max_age: float = 0.0) -> None:
        self._model_dir = model_dir
        self._max_age = max_age
        self._directory: str | None = None
        self._state: _Entered | None = None

    def __enter__(self) -> str | None:
        if self._model_dir is None:
            return None
        directory = _normdir(self._model_dir)
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

    The next import within a block re-executes the files: use it after editing a model dir's
    ``.py`` files (class objects change, so rebuild handlers and models). Modules loaded with
    :func:`load_module_from_file` from that dir are dropped too. Modules that were imported
    outside any block (e.g. your project's package when the model dir is the project root) stay
    in ``sys.modules``.
    """
    with _lock:
        dirs = [_normdir(model_dir)] if model_dir is not None else list(_caches)
        for directory in dirs:
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


def exec_source(module: ModuleType, file: str) -> None:
    """Execute ``file``'s current source in ``module``, never a cached ``.pyc``.

    A bytecode cache is checked by mtime (whole seconds) and size, so a file rewritten within a
    second to the same size would run its old code: an edit-and-reload loop must not.
    """
    with open(file, "rb") as f:
        source = importlib.util.decode_source(f.read())
    exec(compile(source, file, "exec", dont_inherit=True), module.__dict__)


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
    the same module unless `reload`.

    Args:
        path: the file.
        module_name: the name to register (a dotted name needs an importable parent).
        import_dir: the dir whose imports the file sees; its own dir by default.
        reload: execute the file again even if it is loaded.

    Returns:
        The module.

    Raises:
        FileNotFoundError: no such file.
        HandlerLoadError: executing the file raised (the real error is chained).
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
    with _lock:
        existing = sys.modules.get(module_name)
        if existing is not None and not reload and getattr(existing, "__file__", None) == file:
            return existing
        if package is not None:
            _ensure_package(package, directory)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise HandlerLoadError(f"{file} cannot be imported as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    done = False
    try:
        with model_dir_imports(import_dir if import_dir is not None else directory):
            exec_source(module, file)
        done = True
    except Exception as exc:
        raise HandlerLoadError(f"importing {file} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if not done:
            if existing is not None:
                sys.modules[module_name] = existing
            else:
                sys.modules.pop(module_name, None)
    if package is not None:
        setattr(sys.modules[package], stem, module)
    return module
