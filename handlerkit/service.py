"""A model and its handler, loaded as TorchServe's worker loads them: the front door.

Named after TorchServe's ``ts/service.py``, which holds a loaded model's context and entry
point. Everything that runs a handler goes through a :class:`Service`: the
:class:`~handlerkit.harness.Harness`, the CLI, the pytest plugin and the Ray Serve replica. ::

    import handlerkit as hk

    with hk.Service.open("model_store/shapes.mar") as svc:   # or a model dir
        svc.initialize()
        out = svc.handle(hk.batch(hk.Request.from_file("circle.png")))

What it does, in the worker's order (``ts/model_loader.py``, ``ts/service.py``):

1. **opens** a model dir or an archive (``.mar``, ``.tar.gz``: unpacked into a temporary dir
   the service owns and removes on :meth:`close`) into a context
   (:meth:`MockContext.from_model_dir <handlerkit.worker.context.MockContext.from_model_dir>`);
2. **takes the manifest's handler** unless given one, in any form: a spec string (resolved by
   :func:`handlerkit.worker.loading.resolve_handler`, from the files as they are now), a class (built
   with no arguments), an instance, or a module-level ``handle(data, context)`` function;
3. **takes the entry point before** ``initialize`` runs: a ``handle`` set on the instance in
   ``__init__`` counts, one set in ``initialize`` does not; a service envelope (``json``,
   ``kserve``, ``kservev2``) is wrapped around it;
4. **runs** ``initialize`` and every batch under the model dir's imports
   (:func:`handlerkit.worker.isolation.model_dir_imports`) **and with the model dir as the working
   directory**: TorchServe's frontend starts the worker process in the model dir, so handlers
   open relative paths (``os.path.isfile("vocab.txt")``) and find them. In a notebook
   (``working_dir="call"``, the default) the previous working directory comes back after every
   call, and a handler that changes it is reported; in a server process
   (``working_dir="process"``) it is set once, as in a worker;
5. **binds** each batch to the context (request ids, headers, fresh response statuses) before
   ``handle``, as the worker does;
6. with ``asyncCommunication: true`` in the model config, **awaits** ``handle`` on an event loop
   of the service's own, in a thread (:mod:`handlerkit.worker.async_worker`), as TorchServe's async
   worker does: :meth:`handle` (and so ``h.run``) blocks until it is done, from a script or
   from a notebook whose own loop is running; :meth:`ahandle` awaits it from any event loop.

A handler that fails is not turned into anything here: what it raises comes out as it is.
The Harness (stage by stage, with :class:`~handlerkit.errors.StageError` s) and the servers
build their reports on top.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitError, HandlerkitWarning, HandlerLoadError
from handlerkit.worker.async_worker import WorkerLoop, awaiting, is_async_config, refusing_coroutines, unawaited
from handlerkit.worker.batches import Batch
from handlerkit.worker.freshness import Sources, module_of, stale
from handlerkit.worker.isolation import dir_modules, model_dir_imports
from handlerkit.worker.loading import instantiate, require_handle, resolve_handler
from handlerkit.worker.workdir import Directories

if TYPE_CHECKING:
    from handlerkit.worker.envelopes import Envelope

__all__ = ["Service", "WorkingDir", "class_bound", "is_base_handle"]

#: Where the handler runs: ``"call"`` chdir into the model dir for each call and back after (a
#: notebook), ``"process"`` chdir once, for good (a server's worker), ``None`` leave it alone.
WorkingDir = Literal["call", "process", None]
_WORKING_DIRS = ("call", "process", None)

Build = Callable[[type], Any]
_LABEL = "the handler"  # what running() calls the code it runs, by default


class Service:
    """A handler ready to serve one model: its context, its entry point, where it runs.

    Args:
        handler: a spec string (``"handler.py"``, ``"image_classifier"``,
            ``"handler.py:handle"``), a handler class (built with no arguments), an instance,
            or a ``handle(data, context)`` function; None takes the manifest's ``handler``.
        context: the context handed to the handler (a :class:`~handlerkit.worker.context.MockContext`
            of the current directory when None); its ``system_properties["model_dir"]`` is the
            model dir.
        envelope: a TorchServe service envelope wrapped around the entry point (``"json"``,
            ``"kserve"``, ``"kservev2"``), as the worker does for a server configured with one.
        build: builds a class handler's instance from its class, in place of ``cls()`` (the
            Harness instruments the instance before ``__init__`` runs).
        working_dir: ``"call"``, ``"process"`` or None (see :data:`WorkingDir`).

    Raises:
        HandlerLoadError: no handler given and the manifest names none, or the handler cannot
            be found, imported or built (the message says where it looked; ``fix`` what to do).
        TypeError: ``handler`` is of no accepted form.
        ValueError: an unknown ``working_dir``.
    """

    def __init__(
        self,
        handler: Any = None,
        context: Any = None,
        *,
        envelope: str | None = None,
        build: Build | None = None,
        working_dir: WorkingDir = "call",
    ) -> None:
        if working_dir not in _WORKING_DIRS:
            raise ValueError(f"working_dir must be 'call', 'process' or None: got {working_dir!r}")
        if context is None:
            from handlerkit.worker.context import MockContext

            context = MockContext()
        self.context = context
        model_dir = (getattr(context, "system_properties", None) or {}).get("model_dir")
        #: The model dir (a real path), or None when the context names none.
        self.model_dir: str | None = os.path.realpath(model_dir) if model_dir else None
        self.working_dir: WorkingDir = working_dir
        self.envelope_name = envelope or None
        #: The spec string the handler was resolved from (None for a class, instance or function).
        self.spec: str | None = None
        #: The handler instance (None for a function handler).
        self.handler: Any = None
        #: The function handler (None for a class handler).
        self.function: Callable[..., Any] | None = None
        #: Where a spec's module came from (``"model_dir"``, ``"handlerkit"``, ``"torchserve"`` …).
        self.origin: str | None = None
        self.module: Any = None  #: The module the handler's class (or function) was defined in, when known.
        self.archive: Any = getattr(context, "archive", None)  # an unpacked archive's temp dir
        self._home: str | None = None  # the model dir when it exists (see refresh)
        self._directories: Directories | None = None  # working_dir="call": the moves around each call
        self._idle: dict[str, _Running] = {}  # running()'s usual block per label, kept for the next call
        # The model config as initialize got it and left it (see _hand_a_fresh_config).
        self._config_original: Any = None
        self._config_handed: Any = None
        self._config_after: Any = None
        self.refresh()
        if working_dir == "process" and self._home is not None:
            os.chdir(self._home)  # before the handler module is imported, as in the worker
        with self.running(max_age=0):  # a fresh look: the model dir's modules as they are on disk now
            self._load(handler if handler is not None else self._manifest_handler(), build)
        #: The files its code came from (not a module an earlier load left, changed since: initialize reloads it).
        self.sources = Sources(m for m in [*dir_modules(self._home), self.module] if m is None or not stale(m))
        # TorchServe's worker takes the entry point before initialize runs (ts/model_loader.py).
        self._own_handle = vars(self.handler).get("handle") if hasattr(self.handler, "__dict__") else None
        self.envelope: Envelope | None = None
        #: ``asyncCommunication: true`` in the model config: handle is awaited on :attr:`worker_loop`.
        self.asynchronous = is_async_config(getattr(context, "model_yaml_config", None))
        self._worker_loop: WorkerLoop | None = None
        #: With :attr:`asynchronous`, ``await``-able ``entry(data, context)`` as the async worker calls it.
        self.coroutine_entry: Callable[[Any, Any], Any] | None = None
        self.entry: Callable[[Any, Any], Any] = self._entry_point()

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        model: str | os.PathLike[str],
        *,
        handler: Any = None,
        config: str | os.PathLike[str] | None = None,
        gpu_id: int | str | None = None,
        batch_size: int | None = None,
        model_name: str | None = None,
        metrics_config: str | os.PathLike[str] | None = None,
        limit_max_image_pixels: bool = True,
        envelope: str | None = None,
        build: Build | None = None,
        working_dir: WorkingDir = "call",
    ) -> Service:
        """Open a model dir or an archive and load its handler (the manifest's unless ``handler``).

        An archive (``.mar``, ``.tar.gz``) is unpacked safely into a temporary dir that the
        service owns: :meth:`close` (or leaving a ``with`` block) removes it. The context's
        arguments are :meth:`MockContext.from_model_dir
        <handlerkit.worker.context.MockContext.from_model_dir>`'s; the rest are the constructor's.

        Raises:
            ModelLoadError: no such model dir, or an unreadable manifest or config.
            ArchiveError: a file that is no archive, or one refused (paths escaping it, links,
                bombs …).
            HandlerLoadError: as the constructor.
        """
        from handlerkit.worker.context import MockContext

        context = MockContext.from_model_dir(
            model,
            gpu_id=gpu_id,
            batch_size=batch_size,
            model_name=model_name,
            config=config,
            limit_max_image_pixels=limit_max_image_pixels,
            metrics_config=metrics_config,
        )
        try:
            return cls(handler, context, envelope=envelope, build=build, working_dir=working_dir)
        except BaseException as error:
            archive = getattr(context, "archive", None)
            if archive is not None:  # tell the failure while the archive's files exist, then remove them
                _named_in_archive(error, str(archive.path), os.fspath(model))
                archive.cleanup()
            raise

    def close(self) -> None:
        """Remove the temporary dir an archive was unpacked into, and let go of the directories
        held open for the working-directory moves."""
        if self._worker_loop is not None:
            self._worker_loop.close()
            self._worker_loop = None
        if self._directories is not None:
            self._directories.close()
            self._directories = None
        if self.archive is not None:
            self.archive.cleanup()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the handler ---------------------------------------------------------------------------
    def _manifest_handler(self) -> str:
        manifest = getattr(self.context, "manifest", None) or {}
        spec = (manifest.get("model") or {}).get("handler") if isinstance(manifest, dict) else None
        if not spec:
            where = f"the manifest of {self.model_dir}" if self.model_dir else "the context's manifest"
            raise HandlerLoadError(
                f"no handler given and {where} names none",
                fix="pass one (a spec such as 'handler.py' or 'image_classifier', a class, an instance or a "
                "function; on the command line --handler SPEC), or write the manifest's handler "
                "(MAR-INF/MANIFEST.json, model.handler)",
            )
        return str(spec)

    def _load(self, handler: Any, build: Build | None) -> None:
        if isinstance(handler, str):
            resolved = resolve_handler(handler, self._home, build=build)
            self.spec, self.origin = handler, resolved.origin
            if resolved.instance is not None:
                self.handler = resolved.instance
            else:
                self.function = resolved.function
        elif inspect.isclass(handler):
            self.handler = instantiate(handler, label=f"class {handler.__name__}", build=build)
            require_handle(self.handler, f"class {handler.__name__}")
        elif inspect.isfunction(handler) or (callable(handler) and not hasattr(handler, "handle")):
            self.function = handler
        elif hasattr(handler, "handle"):
            self.handler = handler
        else:
            raise TypeError(
                "a handler is a spec string, a class, an instance with a handle method or a "
                f"handle(data, context) function; got {handler!r}"
            )
        self.module = module_of(self.function if self.function is not None else type(self.handler))  # in the block

    @property
    def name(self) -> str:
        """The handler's class name, or the function's qualified name."""
        if self.handler is not None:
            return type(self.handler).__name__
        return getattr(self.function, "__qualname__", None) or type(self.function).__name__

    @property
    def is_function(self) -> bool:
        """True for a module-level ``handle(data, context)`` handler."""
        return self.function is not None

    @property
    def single_stage(self) -> bool:
        """True when the entry point is not TorchServe's ``BaseHandler.handle`` (a function
        handler, an override, or a ``handle`` set on the instance): then only a run through
        ``handle`` shows what the server does."""
        if self.is_function or self._own_handle is not None:
            return True
        return not is_base_handle(class_bound(self.handler, "handle"))

    def _entry_point(self) -> Callable[[Any, Any], Any]:
        if self.function is not None:
            handle = self.function
        elif self._own_handle is not None:
            handle = self._own_handle
        else:
            handle = class_bound(self.handler, "handle")
        entry = handle
        if self.envelope_name is None:
            self.envelope = None
        else:
            from handlerkit.worker.envelopes import get_envelope

            self.envelope = get_envelope(self.envelope_name)(handle)  # one for the model's lifetime
            self.envelope.context = self.context
            entry = self.envelope.handle
        if self.asynchronous:
            self.coroutine_entry = awaiting(entry, self.name)
            return self._on_worker_loop
        if inspect.iscoroutinefunction(getattr(handle, "__func__", handle)):
            return refusing_coroutines(entry, self.name)
        return entry

    # -- async handlers (asyncCommunication: true) ------------------------------------------------
    @property
    def worker_loop(self) -> WorkerLoop:
        """The event loop an async handler runs on, in its own thread; in a server process
        (``working_dir="process"``) that thread holds the model dir's imports for good."""
        if self._worker_loop is None:
            setup = None
            if self.working_dir == "process":
                block = self.running("the async handler", max_age=0)
                setup = block.__enter__  # never left: the process is the model's worker
            self._worker_loop = WorkerLoop(f"handlerkit-{self.name}-loop", setup=setup)
        return self._worker_loop

    def _on_worker_loop(self, data: Any, context: Any) -> Any:
        """The entry point of an async handler for synchronous callers: awaited on the worker loop."""
        assert self.coroutine_entry is not None  # set with asynchronous
        return self.worker_loop.run(self.coroutine_entry(data, context))

    async def ahandle(self, batch_or_data: Any, *, context: Any = None) -> Any:
        """:meth:`handle` for an async handler, awaited from any event loop (a notebook's, a Ray
        replica's); several run at once, as in the async worker, which hands each batch a deep
        copy of its context: concurrent callers pass ``context``, a copy each (default: the
        service's). Raises HandlerkitError without ``asyncCommunication: true``."""
        if self.coroutine_entry is None:
            raise HandlerkitError(
                f"{self.name} is served synchronously (the model config does not say asyncCommunication: true), "
                "so there is nothing to await",
                fix="call handle(batch) (in a notebook h.run(batch)), or add asyncCommunication: true to "
                "model-config.yaml with an `async def handle`",
            )
        context = self.context if context is None else context
        batch = self.bind(batch_or_data, context)
        future = asyncio.wrap_future(self.worker_loop.submit(self.coroutine_entry(batch.data, context)))
        if self.working_dir == "process":  # the loop's thread holds the imports, and cwd is set for good
            return await future
        with self.running("handle"):
            return await future

    def replace(self, new: Any, module: Any) -> None:
        """Swap in ``new``, the handler's class (the instance keeps its state) or function, from
        ``module`` (``Harness.reload``); the entry point is taken again and :attr:`sources` start
        afresh, each file as it is now (``Harness.reload`` initializes again when others changed)."""
        if self.function is not None:
            self.function = new
        else:
            self.handler.__class__ = new
        self.module = module
        self.entry = self._entry_point()
        self.sources = self.sources.renewed([*dir_modules(self._home), module])

    # -- where it runs -------------------------------------------------------------------------
    def refresh(self) -> None:
        """Look again whether the model dir exists (at construction, initialize and reload, not
        per call: a stat costs microseconds between two bursts of torch work)."""
        home = self.model_dir if self.model_dir and os.path.isdir(self.model_dir) else None
        if self.working_dir == "call" and (self._directories is None or self._directories.home != home):
            if self._directories is not None:
                self._directories.close()
            self._directories = Directories(home) if home is not None else None
        self._home = home

    def running(self, label: str = _LABEL, *, max_age: float = 1.0) -> _Running:
        """A context manager under which the handler runs as in its worker: the model dir's
        imports (``import model`` finds the dir's own) and, with ``working_dir="call"``, the
        model dir as the working directory, the previous one back on exit. Blocks nest freely
        (only the outermost changes directory); ``label`` names the code run inside in the
        warning given when it changes the working directory. ``max_age``: trust the dir for this
        many seconds; 0 looks afresh, its modules as its files are now (:func:`model_dir_imports`)."""
        idle = self._idle.get(label) if max_age == 1.0 else None  # the usual block, made once per label
        if idle is None or idle.entered:  # (entered: a block inside it, or another thread's: one of its own)
            idle = _Running(self, label, max_age)
            if max_age == 1.0 and label not in self._idle:
                self._idle[label] = idle
        return idle

    # -- the worker's calls ---------------------------------------------------------------------
    def initialize(self) -> None:
        """TorchServe's initialisation: ``initialize(context)`` for a class handler (skipped when
        it has none), ``handle(None, context)`` for a function handler (bypassing the envelope,
        as the worker does). What it raises comes out as it is. An async handler's runs in the
        worker loop's thread with that loop set and not running, as in the worker's main thread
        (so ``asyncio.get_event_loop().run_until_complete(...)`` there sets up on the loop
        ``handle`` is awaited on); an ``async def`` one is never awaited, as in the worker (warned)."""
        self.refresh()
        self._hand_a_fresh_config()
        with self.running("initialize", max_age=0):
            if self.asynchronous:  # the worker's main thread, its loop not running yet
                self.worker_loop.call(self._initialize)
            else:
                self._initialize()
        self._config_after = copy.deepcopy(getattr(self.context, "model_yaml_config", None))
        self.sources.add(dir_modules(self._home))  # what initialize imported (TorchServe's model.py)
        late = vars(self.handler).get("handle") if hasattr(self.handler, "__dict__") else None
        if late is not None and late is not self._own_handle:
            warnings.warn(
                f"handlerkit: {self.name}.initialize sets self.handle, but TorchServe's worker takes handle "
                "before initialize runs, so the server ignores it (and so does handlerkit); set it in __init__",
                HandlerkitWarning,
                stacklevel=user_stacklevel(),
            )

    def _initialize(self) -> None:
        if self.function is not None:
            unawaited(self.function(None, self.context), "handle(None, context)", self.name)
        elif hasattr(self.handler, "initialize"):
            unawaited(self.handler.initialize(self.context), "initialize", self.name)

    def _hand_a_fresh_config(self) -> None:
        """Hand ``initialize`` a copy of the model config: TorchServe's BaseHandler.initialize
        deletes ``pt2.compile.enable`` from the dict it gets, which would break a second
        initialize (a notebook's re-run). A config the user replaced or edited since is taken
        as the new original."""
        config = getattr(self.context, "model_yaml_config", None)
        if not isinstance(config, dict):
            return
        if config is not self._config_handed or config != self._config_after:
            self._config_original = copy.deepcopy(config)
        self._config_handed = copy.deepcopy(self._config_original)
        self.context.model_yaml_config = self._config_handed

    def bind(self, batch_or_data: Any, context: Any = None) -> Batch:
        """Make ``batch_or_data`` (a Batch, a Request, or any list ``handle`` accepts) the
        current batch of ``context`` (the service's by default), as the worker does before ``handle``;
        returns the Batch. The one place a caller's batch is read (the Harness's, handle's, the servers')."""
        batch = batch_or_data if type(batch_or_data) is Batch else Batch.coerce(batch_or_data)
        batch.bind(self.context if context is None else context)
        return batch

    def handle(self, batch_or_data: Any) -> Any:
        """Exactly what the worker does for a batch: bind it, call the entry point with its data."""
        batch = self.bind(batch_or_data)
        with self.running("handle"):
            return self.entry(batch.data, self.context)

    def __repr__(self) -> str:
        what = f"class {self.name}" if self.handler is not None else f"function {self.name}"
        spec = f" from {self.spec!r}" if self.spec else ""
        envelope = f", envelope={self.envelope_name!r}" if self.envelope_name else ""
        return f"<Service {what}{spec}, model dir {self.model_dir}{envelope}>"


class _Running:
    """The context manager :meth:`Service.running` returns (a class with slots: the Harness
    enters one for every run and step, so entering and leaving are kept to a few operations)."""

    __slots__ = ("_home", "_imports", "_label", "_service", "entered")

    def __init__(self, service: Service, label: str, max_age: float) -> None:
        self._service = service
        self._label = label
        self._home = service._home
        self._imports = model_dir_imports(self._home, max_age=max_age)
        self.entered = False

    def __enter__(self) -> str | None:
        service = self._service
        if service._home != self._home:  # refreshed since this block was made
            self._home = service._home
            self._imports = model_dir_imports(self._home, max_age=1.0)
        directories = service._directories
        if directories is not None:
            directories.enter()
        self.entered = True
        return self._imports.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self.entered = False
        try:
            self._imports.__exit__(*exc_info)
        finally:
            directories = self._service._directories
            if directories is not None:
                directories.leave(self._label)


def is_base_handle(func: Any) -> bool:
    """True for ``BaseHandler.handle`` of handlerkit or TorchServe (a handle that runs the stages)."""
    from handlerkit.handlers.base import BaseHandler

    func = getattr(func, "__func__", func)
    if func is BaseHandler.handle:
        return True
    module = getattr(func, "__module__", "") or ""
    return module == "ts.torch_handler.base_handler" and getattr(func, "__qualname__", "") == "BaseHandler.handle"


def class_bound(handler: Any, name: str) -> Any:
    """The class's attribute ``name`` bound to ``handler`` as attribute lookup binds it (a
    staticmethod stays a function, a classmethod gets the class), ignoring the instance dict."""
    cls = type(handler)
    for klass in cls.__mro__:  # inspect.getattr_static's walk, without its checks
        namespace = vars(klass)
        if name in namespace:
            attr = namespace[name]
            break
    else:
        raise AttributeError(f"{cls.__name__} has no {name}")
    get = getattr(type(attr), "__get__", None)
    return get(attr, handler, cls) if get is not None else attr


def _named_in_archive(error: BaseException, unpacked: str, archive: str) -> None:
    """A handler of ``archive`` failed to load from ``unpacked``: the line its code raised at is
    read while the file exists, and the unpacked files are named ``archive/member`` in the error."""
    from handlerkit.archive.extract import name_archive_files
    from handlerkit.worker.locations import raised_at

    if isinstance(error, HandlerLoadError) and error.__cause__ is not None and getattr(error, "location", None) is None:
        error.location = raised_at(error.__cause__)  # type: ignore[attr-defined]
    name_archive_files(error, unpacked, archive)
