"""What TorchServe's worker calls for a batch: the handler's ``handle`` as it stood before
``initialize`` ran (``ts/model_loader.py`` takes the entry point first), inside the service
envelope when the model is served with one."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["class_bound", "entry_point", "is_base_handle"]


def is_base_handle(func: Any) -> bool:
    """True for BaseHandler.handle of handlerkit or TorchServe (handle runs the stages)."""
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
    for klass in cls.__mro__:  # inspect.getattr_static's walk, without its checks: this runs per batch
        namespace = vars(klass)
        if name in namespace:
            attr = namespace[name]
            break
    else:
        raise AttributeError(f"{cls.__name__} has no {name}")
    get = getattr(type(attr), "__get__", None)
    return get(attr, handler, cls) if get is not None else attr


def entry_point(handler: Any, function: Any, own_handle: Any, envelope: str | None) -> Callable[[Any, Any], Any]:
    """``function`` (a function handler), else the ``handle`` the instance set in ``__init__``
    (``own_handle``), else its class's; wrapped in ``envelope`` when given."""
    if function is not None:
        handle = function
    elif own_handle is not None:
        handle = own_handle
    else:
        handle = class_bound(handler, "handle")
    if envelope is None:
        return handle
    from handlerkit.envelopes import wrap

    return wrap(handle, envelope)
