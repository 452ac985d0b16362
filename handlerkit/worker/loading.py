"""Find a handler the way TorchServe 0.12 does (each model dir's imports are :mod:`handlerkit.worker.isolation`'s).

**Handler specs** (``ts/model_loader.py``): ``name``, ``name.py``, ``path/to/name.py``,
``file.py:function``, ``name:function`` or a dotted module path. The module is imported with
the model dir first on ``sys.path``. A module attribute named ``handle`` (or the function named
after ``:``) is a function entry point, initialised by ``handle(None, context)``; otherwise the
module must define exactly one class (``cls.__module__ == module.__name__``), which is built
with no arguments and must have ``handle``.

Where handlerkit differs, it is to show what TorchServe hides:

- when the handler module exists but fails to import, TorchServe swallows the ImportError and
  retries the spec as ``ts.torch_handler.<spec>``: the user sees "No module named
  'ts.torch_handler.<name>'", or, when the spec is the bare name of a TorchServe built-in
  (``image_classifier``), no error at all and the built-in served instead. handlerkit raises
  :class:`~handlerkit.errors.HandlerLoadError` naming the file, quoting the real error and
  saying which of the two TorchServe would have done;
- a bare name that is no module at all falls back to handlerkit's built-ins
  (``handlerkit.handlers.<name>``) and then, when torchserve is installed, to TorchServe's
  (``ts.torch_handler.<name>``), so a manifest naming ``text_handler`` gets what the server
  would run. A dotted path (``ts.torch_handler.image_classifier``) picks one explicitly;
- ``file.py:function`` naming a function the module lacks is an error (TorchServe silently
  falls back to the module's class).

**Import isolation** (a bare ``import model`` resolving to the handler's own model dir when a
notebook holds several) lives in :mod:`handlerkit.worker.isolation`; its public names are re-exported
here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import pkgutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from handlerkit._stack import user_stacklevel
from handlerkit._text import did_you_mean
from handlerkit.errors import HandlerkitWarning, HandlerLoadError
from handlerkit.worker.freshness import import_failure, torchserve_missing
from handlerkit.worker.isolation import (  # the public ones re-exported: handlerkit.worker.loading is where users met them
    _belongs,
    _normdir,
    _provided,
    clear_module_cache,
    load_module_from_file,
    model_dir_imports,
)

__all__ = [
    "BUILTIN_PACKAGES",
    "ResolvedHandler",
    "clear_module_cache",
    "instantiate",
    "list_classes",
    "load_module_from_file",
    "model_dir_imports",
    "require_handle",
    "resolve_handler",
]

#: Packages searched, in order, for a bare handler name that is no module of its own.
BUILTIN_PACKAGES: tuple[str, ...] = ("handlerkit.handlers", "ts.torch_handler")
_BUILTIN_ORIGINS = {"handlerkit.handlers": "handlerkit", "ts.torch_handler": "torchserve"}

Origin = Literal["model_dir", "file", "sys.path", "handlerkit", "torchserve"]


# ----------------------------------------------------------------------------------------------
# Resolution


@dataclass(repr=False)
class ResolvedHandler:
    """A handler found from a spec string: what :class:`handlerkit.service.Service` loads
    (it initialises and runs it).

    Attributes:
        spec: the spec as given.
        kind: ``"class"`` (an instance of the module's one class) or ``"function"``.
        module: the imported module.
        module_file: its file, when it has one.
        cls: the handler class (None for a function handler).
        instance: the handler instance, built with no arguments (None for a function handler).
        function: the entry point: ``instance.handle`` or the module-level function.
        function_name: ``"handle"`` or the name after ``:`` in the spec.
        model_dir: the dir whose imports the handler sees (:class:`handlerkit.service.Service`
            runs the handler within them).
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

    def __repr__(self) -> str:
        what = f"class {self.cls.__name__}" if self.cls is not None else f"function {self.function_name}"
        where = self.module_file or self.module.__name__
        return f"ResolvedHandler({self.spec!r} -> {what} in {where}, origin={self.origin!r})"


def resolve_handler(
    spec: str,
    model_dir: str | os.PathLike[str] | None = None,
    *,
    reload: bool = False,
    build: Callable[[type], Any] | None = None,
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
        build: builds a class handler's instance from its class, in place of ``cls()`` (the
            Harness instruments the instance before ``__init__`` runs). It runs within the
            model dir's imports, and what it raises is reported as a failing constructor.

    Returns:
        The resolved handler; a class handler is already instantiated, not initialised.

    Raises:
        HandlerLoadError: not found (the message lists where handlerkit looked), the module
            fails to import (the real error, chained), or it breaks TorchServe's rules (several
            classes, no class, no ``handle``, a constructor that needs arguments). Its ``fix``
            says what to do.
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
    scope: str | None
    if _is_file_spec(module_part):
        module, scope, origin = _import_file_spec(text, module_part, mdir)
    else:
        module, origin = _import_module_spec(text, module_part, mdir)
        scope = mdir
    return _entry_point(text, module_part, module, function_name, scope, origin, build)


def list_classes(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """The classes defined in `module` (``cls.__module__ == module.__name__``), sorted by name.

    This is TorchServe's ``list_classes_from_module``: classes imported into the module do not
    count. With `parent_class`, only its subclasses.
    """
    classes = [
        member for _, member in inspect.getmembers(module, inspect.isclass) if member.__module__ == module.__name__
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
            f"handler {spec!r}: no such file. Looked for:\n{looked}",
            fix="check the path (relative paths are tried in the model dir, then in the current directory)",
        )
    found = os.path.realpath(found)
    fdir, stem = os.path.dirname(found), os.path.basename(found)[:-3]
    if mdir is not None and fdir != mdir:
        module = load_module_from_file(found, import_dir=mdir)
        return module, mdir, "file"
    if not stem.isidentifier():
        raise HandlerLoadError(
            f"handler {spec!r}: {found} cannot be imported: TorchServe imports the handler by its file "
            f"name and {stem!r} is not a valid module name",
            fix=f"rename it to {_identifier(stem)}.py",
        )
    imported = _import_by_name(spec, stem, fdir)
    if imported is None:  # pragma: no cover - the file exists, so only a race gets here
        raise HandlerLoadError(f"handler {spec!r}: {found} vanished while importing it")
    module = imported
    return module, fdir, "model_dir"


def _import_module_spec(spec: str, name: str, mdir: str | None) -> tuple[ModuleType, Origin]:
    if not all(part.isidentifier() for part in name.split(".")):
        raise HandlerLoadError(
            f"handler {spec!r}: {name!r} is not a module name",
            fix="write name, name.py, path/to/name.py, file.py:function or a dotted module path "
            "(e.g. ts.torch_handler.image_classifier)",
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
    raise _not_found(spec, name, mdir)


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
    lines, fix = import_failure(exc, scope, file)  # where it failed; a fix of its own for some causes
    message = f"handler {spec!r}: importing module {name!r}{where} failed: {type(exc).__name__}: {exc}{lines}"
    if isinstance(exc, ImportError) and not builtin and not torchserve_missing(exc):  # (ts is there under TorchServe)
        hidden = _torchserve_retry_error(spec)
        if hidden is None:
            message += (
                f"\nTorchServe 0.12 would have silently served its own ts.torch_handler.{spec} instead "
                f"(when a handler fails to import it retries the name as one of its built-in handlers), "
                f"so this error would never have shown"
            )
        else:
            message += (
                f'\nTorchServe 0.12 would have hidden this error behind "{hidden}" (when a handler '
                f"fails to import it retries the name as one of its built-in handlers)"
            )
    if fix is None and isinstance(exc, ModuleNotFoundError) and exc.name:
        fix = (
            f"if {exc.name!r} is a package, pip install it (and list it in the archive's requirements "
            f"file); if it is one of your files, put it in the model dir (torch-model-archiver --extra-files)"
        )
    return HandlerLoadError(
        message, fix=fix or f"correct {file or name}: importing it raises the {type(exc).__name__} above"
    )


def _torchserve_retry_error(spec: str) -> str | None:
    """The error TorchServe's retry ``import_module("." + spec, "ts.torch_handler")`` raises.

    None when the retry succeeds: ``spec`` is the bare name of one of its built-ins, which it
    then serves in place of the user's file.
    """
    builtins = _torchserve_builtin_names() or _TORCHSERVE_BUILTINS
    first, dot, rest = spec.partition(".")
    if first not in builtins:
        return f"No module named 'ts.torch_handler.{first}'"
    if not dot:
        return None
    parent = f"ts.torch_handler.{first}"
    # Python names the missing submodule; a plain module as parent adds "is not a package".
    nested = f"No module named '{parent}.{rest.split('.')[0]}'"
    return nested if first in _TORCHSERVE_PACKAGES else f"{nested}; '{parent}' is not a package"


def _module_origin(name: str, scope: str | None) -> str | None:
    try:
        with model_dir_imports(scope):
            found = importlib.util.find_spec(name)
    except Exception:
        return None
    return found.origin if found is not None and found.has_location else None


def _not_found(spec: str, name: str, mdir: str | None) -> HandlerLoadError:
    looked = []
    if mdir is not None:
        looked.append(
            f"module {name!r} in the model dir {mdir} ({name.replace('.', '/')}.py or package), then on sys.path"
        )
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
    near = did_you_mean(name, candidates, cutoff=0.75, prefix=False)
    listing = "\n".join(f"  - {line}" for line in looked)
    stem = name.split(".")[-1]
    return HandlerLoadError(
        f"handler {spec!r} not found" + (f" (did you mean {near!r}?)" if near else "") + f". Looked for:\n{listing}",
        fix=(f"write {near!r} if that is the one; otherwise " if near else "check the spelling, or ")
        + f"put {stem}.py in the model dir (torch-model-archiver --handler {stem}.py)",
    )


def require_handle(instance: Any, what: str) -> None:
    """Raise the HandlerLoadError for a handler instance without ``handle`` (``what`` names it)."""
    if not hasattr(instance, "handle"):
        raise HandlerLoadError(
            f"{what} has no handle method; TorchServe calls instance.handle(data, context)",
            fix="subclass handlerkit.BaseHandler (or TorchServe's), or define def handle(self, data, context): ...",
        )


def _entry_point(
    spec: str,
    module_part: str,
    module: ModuleType,
    function_name: str | None,
    scope: str | None,
    origin: Origin,
    build: Callable[[type], Any] | None = None,
) -> ResolvedHandler:
    name = function_name or "handle"
    module_file = getattr(module, "__file__", None)
    label = f"module {module.__name__}" + (f" ({module_file})" if module_file else "")
    if hasattr(module, name):
        function = getattr(module, name)
        if inspect.isclass(function):
            raise HandlerLoadError(
                f"handler {spec!r}: {name} in {label} is a class; after ':' TorchServe names a function "
                f"and would call {name}(data, context) for every batch",
                fix=f"write {module_part!r} (TorchServe then uses the module's one class), or name a function "
                f"handle(data, context)",
            )
        if not callable(function):
            raise HandlerLoadError(
                f"handler {spec!r}: {label} has {name} = {type(function).__name__}, not a function; "
                f"TorchServe calls {name}(data, context)",
                fix=f"define def {name}(data, context): ...",
            )
        return ResolvedHandler(spec, "function", module, module_file, None, None, function, name, scope, origin)
    if function_name is not None:
        functions = [n for n, f in inspect.getmembers(module, inspect.isfunction) if f.__module__ == module.__name__]
        raise HandlerLoadError(
            f"handler {spec!r}: {label} has no function {function_name!r} "
            f"(functions defined there: {', '.join(functions) or 'none'}); TorchServe 0.12 would silently "
            f"fall back to the module's class",
            fix=f"correct the name after ':', or drop ':{function_name}' to use the class",
        )
    classes = list_classes(module)
    suggestion = f"{module_part}:handle"
    if len(classes) > 1:
        names = ", ".join(c.__name__ for c in classes)
        raise HandlerLoadError(
            f"handler {spec!r}: {label} defines {len(classes)} classes ({names}) and no function 'handle'; "
            f'TorchServe needs exactly one class or a function entry point (it raises "Expected only one '
            f'class in custom service code or a function entry point")',
            fix=f"keep one class in the module (move helpers to another file) or name the function: {suggestion!r}",
        )
    if not classes:
        imported = [
            n
            for n, c in inspect.getmembers(module, inspect.isclass)
            if hasattr(c, "handle") and c.__module__ != module.__name__
        ]
        seen = (
            f"; it imports {', '.join(imported)}, but classes imported from elsewhere do not count "
            f"(TorchServe checks cls.__module__)"
            if imported
            else ""
        )
        raise HandlerLoadError(
            f"handler {spec!r}: {label} defines no class and no function 'handle'; TorchServe needs one "
            f"handler class or a function handle(data, context){seen}",
            fix=(
                f"subclass it in the module: class MyHandler({imported[0]}): pass"
                if imported
                else "define a handler class (e.g. subclass handlerkit.BaseHandler) or def handle(data, context): ..."
            ),
        )
    cls = classes[0]
    with model_dir_imports(scope):
        instance = instantiate(cls, label=f"handler {spec!r}", build=build)
    require_handle(instance, f"handler {spec!r}: class {cls.__name__} in {label}")
    if not hasattr(instance, "initialize"):
        warnings.warn(
            f"handlerkit: handler class {cls.__name__} has no initialize method; TorchServe 0.12 fails to "
            f"load it (AttributeError: 'initialize'). Add def initialize(self, context): ...",
            HandlerkitWarning,
            stacklevel=user_stacklevel(),
        )
    return ResolvedHandler(spec, "class", module, module_file, cls, instance, instance.handle, "handle", scope, origin)


def instantiate(cls: type, *, label: str, build: Callable[[type], Any] | None = None) -> Any:
    """``cls()`` (or ``build(cls)``), as TorchServe builds a handler: with no arguments.

    Raises:
        HandlerLoadError: the constructor raised; the error says so and chains it.
    """
    try:
        return build(cls) if build is not None else cls()
    except Exception as exc:
        raise HandlerLoadError(
            f"{label}: TorchServe builds the handler with {cls.__name__}() (no arguments), and that "
            f"raised {type(exc).__name__}: {exc}",
            fix="give every __init__ argument a default, or move the setup into initialize(self, context)",
        ) from exc


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


# ts/torch_handler in TorchServe 0.12, for messages when torchserve is not installed here (a
# server always has its built-ins); the packages among them.
_TORCHSERVE_BUILTINS = tuple(
    "base_handler contractions dali_handler dali_image_classifier densenet_handler distributed image_classifier "
    "image_segmenter object_detector request_envelope text_classifier text_handler trt_llm_handler vision_handler "
    "vllm_handler".split()
)
_TORCHSERVE_PACKAGES = ("distributed", "request_envelope")


@functools.lru_cache(maxsize=1)
def _torchserve_builtin_names() -> tuple[str, ...]:
    if not _torchserve_installed():
        return ()
    found = importlib.util.find_spec("ts")
    locations = list(found.submodule_search_locations or ()) if found is not None else []
    paths = [os.path.join(loc, "torch_handler") for loc in locations]
    return tuple(m.name for m in pkgutil.iter_modules(paths) if not m.name.startswith("_") and m.name != "unit_tests")
