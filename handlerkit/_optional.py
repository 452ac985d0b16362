"""Optional dependencies: import one where it is used, or say which pip command brings it.

``import handlerkit`` needs none of them; the feature that does imports its package through
:func:`require`, so a missing one fails with the command that fixes it, chained to the
original ImportError::

    ort = require("onnxruntime", feature="loading .onnx models", extra="onnx")
    # ImportError: loading .onnx models needs onnxruntime: pip install 'handlerkit[onnx]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, *, feature: str, extra: str | None = None, pip: str | None = None) -> ModuleType:
    """Import `module` for `feature`, or raise an ImportError that names the pip command.

    Args:
        module: the module to import (``"onnxruntime"``, ``"captum.attr"``); the package named
            in the message is its top-level name.
        feature: what needs it, the subject of the message (``"loading .onnx models"``).
        extra: the handlerkit extra that installs it: ``pip install 'handlerkit[<extra>]'``.
        pip: the command to print instead, for a package no extra brings
            (``"pip install captum"``). With neither, ``pip install <package>``.

    Returns:
        The imported module.

    Raises:
        ImportError: `module` cannot be imported: ``"<feature> needs <package>: <command>"``,
            chained from the original error. When the package is installed but importing it
            fails (one of its own dependencies is missing, say), the message adds that error.
        ValueError: both `extra` and `pip` are given.
    """
    if extra is not None and pip is not None:
        raise ValueError(f"require({module!r}): give extra or pip, not both (got extra={extra!r}, pip={pip!r})")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.partition(".")[0]
        if pip is not None:
            command = pip
        elif extra is not None:
            command = f"pip install 'handlerkit[{extra}]'"
        else:
            command = f"pip install {package}"
        message = f"{feature} needs {package}: {command}"
        if not _is_absent(exc, module):
            message += f" ({package} is installed, but importing {module} failed: {type(exc).__name__}: {exc})"
        raise ImportError(message, name=module) from exc


def _is_absent(exc: ImportError, module: str) -> bool:
    """Whether `exc` says `module` itself (or a package above it) is not there."""
    missing = exc.name
    return (
        isinstance(exc, ModuleNotFoundError)
        and bool(missing)
        and (module == missing or module.startswith(f"{missing}."))
    )
