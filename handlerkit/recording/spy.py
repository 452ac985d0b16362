"""The harness's view into ``handle``: which stage methods it calls, however it calls them.

TorchServe's worker calls the handler's ``handle``; the harness runs the same ``handle`` and
wants a record of each stage it calls. The handler's class is swapped for a subclass of it (same
name, module and layout; :func:`spied_class`) whose stage methods call the class's own and,
while a run is going on (:func:`start` … :func:`stop`), tell that run's
:class:`~handlerkit.recording.recorder.Recorder`. The harness builds a handler from that
subclass, so even an object that grabs ``handler.preprocess`` in ``__init__`` (TorchServe's
``MicroBatching`` hands it to its threads) calls through them. Copies and pickles of a spied
handler are of its own class.

Two more ways a stage is reached are watched too:

- a stage set on the instance (``h.handler.postprocess = lambda d: [1]``, a common test trick):
  for the length of a run it is shadowed by a recording wrapper (:func:`start`, :func:`stop`);
- stage methods taken *before* the class was swapped (a handler built before the harness saw
  it, whose ``__init__`` kept ``self.preprocess``, as TorchServe's ``MicroBatching`` does for its
  threads): :func:`spy_on` hands them the spied methods.

A call reached both ways at once (a wrapper that calls the spied method) is recorded once.
"""

from __future__ import annotations

import copyreg
import inspect
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

from handlerkit.errors import HandlerkitError

__all__ = ["SPIED", "build_spied", "is_spied", "own_class", "spied_class", "spy_on", "start", "stop", "takes_context"]

#: Handler methods a run watches, and the stage each one is.
SPIED = (
    ("preprocess", "preprocess"),
    ("inference", "inference"),
    ("postprocess", "postprocess"),
    ("explain_handle", "explain"),
    ("describe_handle", "describe"),
)


_SPIED_CLASSES: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()
_RUNNING: dict[int, Any] = {}  # id(handler) -> the Recorder of the run going on
_SHADOWED: dict[int, list[tuple[str, Any, Any]]] = {}  # id(handler) -> (name, wrapper, the instance's own)
_MARK = "__handlerkit_spied__"
_INSIDE = threading.local()  # .calls: the (id(handler), stage) calls being recorded on this thread


def _call(recorder: Any, stage: str, method: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """``method(*args, **kwargs)`` recorded as one call of ``stage``."""
    if stage == "describe" or not args:  # no positional input: record the first keyword's value
        value = args[0] if args else next(iter(kwargs.values()), None)
        return recorder.call(stage, lambda _value: method(*args, **kwargs), value)
    return recorder.call(stage, method, *args, **kwargs)


def _call_once(key: tuple[int, str], recorder: Any, method: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """:func:`_call`, unless a call of that stage (``key[1]``) on that handler is being recorded
    on this thread already: a stage set on the instance that calls the class's (it counts there)."""
    inside: set[tuple[int, str]] | None = getattr(_INSIDE, "calls", None)
    if inside is None:
        inside = _INSIDE.calls = set()
    if key in inside:
        return method(*args, **kwargs)
    inside.add(key)
    try:
        return _call(recorder, key[1], method, args, kwargs)
    finally:
        inside.discard(key)


def _spy(name: str, stage: str, owner: list[type]) -> Callable[..., Any]:
    """A stage method that calls the class's own and, during a run, tells the run's recorder."""
    describe = stage == "describe"  # recorded with no input (see _call)

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        method = getattr(super(owner[0], self), name)  # staticmethods, classmethods... bound as usual
        key = id(self)
        recorder = _RUNNING.get(key)
        if recorder is None:
            return method(*args, **kwargs)
        if key in _SHADOWED:  # a stage set on the instance may be recording this call already
            return _call_once((key, stage), recorder, method, args, kwargs)
        if args and not describe:  # the usual call, input first: no detour through _call (every run, every stage)
            return recorder.call(stage, method, *args, **kwargs)
        return _call(recorder, stage, method, args, kwargs)

    spy.__name__ = spy.__qualname__ = name
    return spy


def spied_class(cls: type) -> type | None:
    """``cls`` with its stage methods reporting to the run going on (a subclass with the same
    name, module and layout, made once per class); None when ``cls`` cannot be subclassed so."""
    if is_spied(cls):
        return cls
    cached = _SPIED_CLASSES.get(cls)
    if cached is not None:
        return cached
    owner: list[type] = []
    namespace: dict[str, Any] = {
        "__slots__": (),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        _MARK: True,
        "__reduce_ex__": _reduce_as(cls, owner),
    }
    for name, stage in SPIED:
        if callable(getattr(cls, name, None)):
            namespace[name] = _spy(name, stage, owner)
    try:
        spied = type(cls)(cls.__name__, (cls,), namespace)
    except TypeError:  # a metaclass or __init_subclass__ that will not have it
        return None
    owner.append(spied)
    _SPIED_CLASSES[cls] = spied
    return spied


def build_spied(cls: type) -> Any:
    """``cls()``, built as its spied subclass (:func:`spied_class`) so that objects made in
    ``__init__`` that keep its stage methods (TorchServe's MicroBatching) call through to the
    recorder (the Harness's ``build`` for :class:`~handlerkit.service.Service`)."""
    return (spied_class(cls) or cls)()


def _reduce_as(cls: type, owner: list[type]) -> Callable[..., Any]:
    """Copies and pickles of a spied handler are of its own class (pass-through anyway)."""

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        reduced = super(owner[0], self).__reduce_ex__(protocol)  # type: ignore[arg-type]
        if not isinstance(reduced, tuple) or len(reduced) < 2:
            return reduced
        args = tuple(cls if arg is owner[0] else arg for arg in reduced[1])
        if reduced[0] is getattr(copyreg, "__newobj__", None):  # pickle insists on the object's own class there
            return (_new_object, args, *reduced[2:])
        return (reduced[0], args, *reduced[2:])

    return __reduce_ex__


def _new_object(cls: type, *args: Any) -> Any:
    """``cls.__new__(cls, *args)``: how a copy or pickle of a spied handler is rebuilt."""
    return cls.__new__(cls, *args)


def spy_on(handler: Any, previous: type | None = None) -> bool:
    """Give an existing handler the spied class of its class; False where that cannot be done
    (then runs report one ``handle`` stage). Stage methods taken from the handler while it was
    of class ``previous`` (by default, its class until now) are given the spied ones."""
    cls = type(handler)
    spied = spied_class(cls)
    if spied is None:
        return False
    if spied is not cls:
        try:
            handler.__class__ = spied
        except TypeError:
            return False
    previous = previous or cls
    if previous is not spied:
        _retake(handler, previous)
    return True


def _retake(handler: Any, previous: type) -> None:
    """Stage methods the handler's ``__init__`` took while it was of class ``previous`` run the
    old definitions and bypass the recorder: bound methods kept on the instance (alone, or in a
    list or tuple there) are bound anew, and TorchServe's ``MicroBatching``, whose threads hold
    them, is given new threads."""
    own = getattr(handler, "__dict__", None)
    if not own:
        return
    stale = {}
    for name, _stage in SPIED:
        func = getattr(previous, name, None)
        if isinstance(func, types.FunctionType):
            stale[func] = name

    spied = vars(type(handler))

    def fresh(value: Any) -> Any:  # the spied class's method in place of the old one
        if isinstance(value, types.MethodType) and value.__self__ is handler and value.__func__ in stale:
            spy = spied.get(stale[value.__func__])
            return types.MethodType(spy, handler) if spy is not None else value
        return value

    names = {name for name, _stage in SPIED}
    for key, value in list(own.items()):
        if key in names:  # a stage set on the instance is the user's own: start() records it
            continue
        if type(value) in (list, tuple):
            items = [fresh(v) for v in value]
            if any(a is not b for a, b in zip(items, value)):
                own[key] = type(value)(items)
        elif _micro_batching(value, handler):
            _restart_threads(value)
        elif fresh(value) is not value:
            own[key] = fresh(value)


def _micro_batching(value: Any, handler: Any) -> bool:
    """TorchServe's ``MicroBatching`` (``ts.handler_utils.micro_batching``) of this handler: it
    took ``getattr(handler, stage)`` for a thread per stage when it was built."""
    return (
        getattr(value, "handler", None) is handler
        and isinstance(getattr(value, "thread_groups", None), dict)
        and isinstance(getattr(type(value), "parallelism", None), property)
    )


def _restart_threads(batching: Any) -> None:
    """New threads for a ``MicroBatching``, which take the stage methods anew (its public
    ``parallelism`` setter joins and starts them). The old ones are all told to stop first, so
    the join waits for one poll of their queues (0.5 s), not one per thread."""
    sizes = {stage: len(workers) for stage, workers in batching.thread_groups.items()}
    for workers in batching.thread_groups.values():
        for worker in workers:
            worker.event.set()
    batching.parallelism = dict.fromkeys(sizes, 0)
    batching.parallelism = sizes


def takes_context(method: Callable[..., Any]) -> bool:
    """Whether a stage method asks for a second positional argument, the context, as TorchServe's
    ``vllm_handler.py`` stages do (``preprocess(self, requests, context)``); a spied stage is
    judged by the method it passes calls on to."""
    owner = getattr(method, "__self__", None)
    if isinstance(method, types.MethodType) and is_spied(type(owner)):
        method = getattr(super(type(owner), owner), method.__name__)
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): called with the value only
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and positional[1].default is inspect.Parameter.empty


def is_spied(cls: type) -> bool:
    """Whether ``cls`` is a spied subclass made by :func:`spied_class`."""
    return bool(vars(cls).get(_MARK))


def own_class(handler: Any) -> type:
    """The handler's class as its author wrote it (not the spied subclass)."""
    cls = type(handler)
    return cls.__mro__[1] if is_spied(cls) else cls


def start(handler: Any, recorder: Any) -> None:
    """Route ``handler``'s stage calls to ``recorder`` until :func:`stop`: those of its class,
    and those of stages set on the instance (shadowed for the run by recording wrappers)."""
    key = id(handler)
    if _RUNNING.setdefault(key, recorder) is not recorder:
        raise HandlerkitError(
            f"{type(handler).__name__} is in the middle of another run (another thread or harness "
            "uses the same handler instance)",
            fix="run one batch at a time on a handler instance, or give each harness its own instance",
        )
    own = getattr(handler, "__dict__", None)
    if not own:
        return
    shadowed = []
    for name, stage in SPIED:
        value = own.get(name)
        if callable(value):
            wrapper = _shadow(key, stage, value, recorder)
            own[name] = wrapper  # into the instance's dict: no user __setattr__ runs
            shadowed.append((name, wrapper, value))
    if shadowed:
        _SHADOWED[key] = shadowed


def _shadow(key: int, stage: str, value: Callable[..., Any], recorder: Any) -> Callable[..., Any]:
    """A stage set on the instance, recorded (for one run)."""

    def recorded(*args: Any, **kwargs: Any) -> Any:
        return _call_once((key, stage), recorder, value, args, kwargs)

    recorded.__wrapped__ = value  # type: ignore[attr-defined]
    return recorded


def stop(handler: Any) -> None:
    key = id(handler)
    _RUNNING.pop(key, None)
    shadowed = _SHADOWED.pop(key, None)
    if shadowed:
        own = vars(handler)
        for name, wrapper, value in shadowed:
            if own.get(name) is wrapper:  # unless the run set the stage anew meanwhile
                own[name] = value
