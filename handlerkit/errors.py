"""The exceptions handlerkit raises, each carrying its fix as data.

Every error a user can meet is a :class:`HandlerkitError`: ``message`` says what was expected
and what came, ``fix`` (when known) says what to do about it. ``str(error)`` shows both, the
fix on its own line after ``fix:``; code reads ``error.fix`` and never parses the text. Bad
arguments to a function are plain ``TypeError``/``ValueError``.

Nothing here imports TorchServe, and importing this module changes nothing outside it.
:class:`PredictionException` still keeps its HTTP code under TorchServe's worker, which catches
only its own class: when one is built while ``ts.utils.util`` is loaded, handlerkit's class is
re-based onto TorchServe's first.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "ConfigError",
    "HandlerLoadError",
    "HandlerkitError",
    "HandlerkitWarning",
    "ModelLoadError",
    "PredictionException",
    "RequestError",
    "StageError",
]


class HandlerkitError(Exception):
    """Base class of every error handlerkit raises on purpose.

    Args:
        message: what was expected and what came.
        fix: what to do about it, when handlerkit knows.
    """

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ConfigError(HandlerkitError):
    """A model-config.yaml (or metrics config) that cannot be read or does not validate.

    Attributes:
        problems: one line per problem found (several are reported together).
    """

    def __init__(self, message: str, *, fix: str | None = None, problems: list[str] | None = None):
        super().__init__(message, fix=fix)
        self.problems = list(problems) if problems is not None else [message]


class HandlerLoadError(HandlerkitError, ImportError):
    """A handler spec that cannot be resolved to a handler (TorchServe's model_loader rules)."""


class ModelLoadError(HandlerkitError):
    """A model dir, manifest, weights file or label map that cannot be loaded.

    Attributes:
        path: the file at fault, when there is one.
    """

    def __init__(self, message: str, path: str | None = None, *, fix: str | None = None):
        super().__init__(message, fix=fix)
        self.path = path


class StageError(HandlerkitError):
    """An exception raised inside a handler stage, with where it happened.

    Attributes:
        stage: ``"initialize"``, ``"preprocess"``, ``"inference"``, ``"postprocess"``,
            ``"handle"``, ``"explain"``, ``"describe"`` or ``"reload"``.
        handler: the handler's class (or function) name.
        request_index: the index in the batch of the request at fault, when known.
        original: the exception the handler raised (also chained as ``__cause__``).
        location: ``(file, line, source text)`` of the innermost frame in the user's code
            where it was raised, when there is one (the last of ``locations``).
        locations: ``(file, line, source text)`` of the line nearest the failure in each user
            file it was raised through, **outermost first, innermost last** (as a traceback
            reads): the handler's ``self.model(*inputs)``, then the model file's line it
            reached. The message shows one ``at file:line: source`` line for each.
    """

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        handler: str = "",
        request_index: int | None = None,
        original: BaseException | None = None,
        fix: str | None = None,
        location: tuple[str, int, str] | None = None,
        locations: list[tuple[str, int, str]] | None = None,
    ):
        super().__init__(message, fix=fix)
        self.stage = stage
        self.handler = handler
        self.request_index = request_index
        self.original = original
        self.locations = list(locations) if locations else ([location] if location is not None else [])
        self.location = location if location is not None else (self.locations[-1] if self.locations else None)

    def __reduce__(self) -> Any:  # keyword-only arguments: pickle and copy rebuild it this way
        return (_rebuild_stage_error, (self.message, self.__dict__.copy()))


class _PredictionBase(Exception):
    """The base of :class:`PredictionException` until TorchServe's class replaces it (a Python
    class, so the two have the same instance layout and ``__bases__`` can be swapped)."""


def _rebuild_stage_error(message: str, state: dict[str, Any]) -> StageError:
    error = StageError(message, stage=state.get("stage", ""))
    error.__dict__.update(state)
    return error


class PredictionException(_PredictionBase):
    """Fail the whole batch with an HTTP code, as ``ts.utils.util.PredictionException`` does.

    TorchServe's worker answers every request of the batch with ``error_code`` and
    ``message``. When TorchServe's module is loaded in the process (as under its worker),
    this class is a subclass of TorchServe's, so a handler written against handlerkit keeps
    its error code under the real server.
    """

    def __init__(self, message: str, error_code: int = 500):
        _adopt_torchserve_base()
        super().__init__(message)
        self.message = message
        self.error_code = error_code

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


class HandlerkitWarning(UserWarning):
    """Diagnostics that are not errors (messages start with ``handlerkit:``)."""


class RequestError(PredictionException, HandlerkitError, ValueError):
    """One request of a batch that a handler cannot decode; names the request index.

    **Raised, it fails the whole batch**: it is a :class:`PredictionException` with code 400, so
    TorchServe answers "400 Bad Request" with this message instead of its generic "503
    Prediction failed" — to every client whose request is in the server's batch, as any
    exception does, though only one request was at fault. The harness (and the developer)
    still learns which request that was.

    To answer that request alone — its own 400 and message, the rest of the batch answered —
    do not raise: call ``self.refuse(index, message, fix=...)`` in ``preprocess``
    (:class:`~handlerkit.handlers.request_errors.PerRequestErrors`, which handlerkit's
    ``BaseHandler`` has and a handler on TorchServe's mixes in). It records a RequestError.

    Attributes:
        reason: what is wrong with the request, as given (``"request 3: the body is empty"``).
        detail: what is wrong without naming the request (``"the body is empty"``), for an answer
            to that request alone; the reason unless given (:func:`~handlerkit.handlers.request_errors.request_error`
            gives both).
        fix: what the client should send instead.
        message: what TorchServe's worker answers the client: the reason and the fix.
    """

    def __init__(
        self,
        message: str,
        request_index: int | None = None,
        error_code: int = 400,
        *,
        fix: str | None = None,
        detail: str | None = None,
    ):
        PredictionException.__init__(self, f"{message}\n  fix: {fix}" if fix else message, error_code)
        self.reason = message
        self.detail = message if detail is None else detail
        self.fix = fix
        self.request_index = request_index

    def __str__(self) -> str:
        return self.message


# ------------------------------------------------------------------ TorchServe's base class
_TS_UTIL = "ts.utils.util"


def _adopt_torchserve_base() -> None:
    """Make :class:`PredictionException` a subclass of TorchServe's, which its worker catches,
    once TorchServe's module is loaded. Called whenever one is built (a dict lookup when nothing
    is to be done), so nothing needs watching imports: under the worker ``ts.utils.util`` is
    imported before the handler, in a notebook it may come later; either way the exception
    raised is of a class the worker's ``except PredictionException`` catches."""
    module = sys.modules.get(_TS_UTIL)
    if module is None:
        return
    base = getattr(module, "PredictionException", None)
    if isinstance(base, type) and issubclass(base, Exception) and not issubclass(PredictionException, base):
        PredictionException.__bases__ = (base,)
