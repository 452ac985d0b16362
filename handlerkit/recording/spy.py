"""The harness's view into ``handle``: which stage methods it calls, however it calls them.

TorchServe's worker calls the handler's ``handle``; the harness runs the same ``handle`` and
wants a record of each stage it calls. The handler's class is swapped for a subclass of it (same
name, module and layout; :func:`spied_class`) whose stage methods call the class's own and,
while a run is going on (:func:`start` … :func:`stop`), tell that run's
:class:`~handlerkit.recording.recorder.Recorder`. The harness builds a handler from that
subclass, so even an object that grabs ``handler.preprocess`` in ``__init__`` (TorchServe's
``MicroBatching`` hands it to its threads) calls through them. Copies and pickles of a spied
handler are of its own class.
"""

from __future__ import annotations

import copyreg
import weakref
from collections.abc import Callable
from typing import Any

from handlerkit.errors import HandlerkitError

__all__ = ["SPIED", "is_spied", "own_class", "spied_class", "spy_on", "start", "stop"]

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
_MARK = "__handlerkit_spied__"


def _spy(name: str, stage: str, owner: list[type]) -> Callable[..., Any]:
    """A stage method that calls the class's own and, during a run, tells the run's recorder."""

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        method = getattr(super(owner[0], self), name)  # staticmethods, classmethods... bound as usual
        recorder = _RUNNING.get(id(self))
        if recorder is None:
            return method(*args, **kwargs)
        if stage == "describe" or not args:  # no positional input: record the first keyword's value
            value = args[0] if args else next(iter(kwargs.values()), None)
            return recorder.call(stage, lambda _value: method(*args, **kwargs), value)
        return recorder.call(stage, method, *args, **kwargs)

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


def spy_on(handler: Any) -> bool:
    """Give an existing handler the spied class of its class; False where that cannot be done
    (then runs report one ``handle`` stage)."""
    cls = type(handler)
    spied = spied_class(cls)
    if spied is None:
        return False
    if spied is not cls:
        try:
            handler.__class__ = spied
        except TypeError:
            return False
    return True


def is_spied(cls: type) -> bool:
    """Whether ``cls`` is a spied subclass made by :func:`spied_class`."""
    return bool(vars(cls).get(_MARK))


def own_class(handler: Any) -> type:
    """The handler's class as its author wrote it (not the spied subclass)."""
    cls = type(handler)
    return cls.__mro__[1] if is_spied(cls) else cls


def start(handler: Any, recorder: Any) -> None:
    """Route ``handler``'s stage calls to ``recorder`` until :func:`stop`."""
    key = id(handler)
    if _RUNNING.setdefault(key, recorder) is not recorder:
        raise HandlerkitError(
            f"{type(handler).__name__} is in the middle of another run (another thread or harness "
            "uses the same handler instance)",
            fix="run one batch at a time on a handler instance, or give each harness its own instance",
        )


def stop(handler: Any) -> None:
    _RUNNING.pop(id(handler), None)
