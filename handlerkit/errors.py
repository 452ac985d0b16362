"""The exceptions handlerkit raises.

Every error a user can meet is a :class:`HandlerkitError`; its message says what was
expected, what came, and how to fix it. Bad arguments to a function are plain
``TypeError``/``ValueError``.
"""

from __future__ import annotations

__all__ = [
    "HandlerkitError",
    "ConfigError",
    "HandlerLoadError",
    "ModelLoadError",
    "StageError",
    "PredictionException",
    "HandlerkitWarning",
    "RequestError",
]


class HandlerkitError(Exception):
    """Base class of every error handlerkit raises on purpose."""


class ConfigError(HandlerkitError):
    """A model-config.yaml that cannot be read or does not validate."""


class HandlerLoadError(HandlerkitError, ImportError):
    """A handler spec that cannot be resolved to a handler (TorchServe's model_loader rules)."""


class ModelLoadError(HandlerkitError):
    """A model dir, manifest, weights file or label map that cannot be loaded.

    Attributes:
        path: the file at fault, when there is one.
    """

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class StageError(HandlerkitError):
    """An exception raised inside a handler stage, with where it happened.

    Attributes:
        stage: ``"initialize"``, ``"preprocess"``, ``"inference"``, ``"postprocess"`` or ``"handle"``.
        handler: the handler's class name.
        request_index: the index in the batch of the request at fault, when known.
        original: the exception the handler raised (also chained as ``__cause__``).
    """

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        handler: str = "",
        request_index: int | None = None,
        original: BaseException | None = None,
    ):
        super().__init__(message)
        self.stage = stage
        self.handler = handler
        self.request_index = request_index
        self.original = original


def _prediction_exception_base() -> type:
    # TorchServe's worker catches its own class only (``except PredictionException``), so when
    # torchserve is installed ours derives from it and keeps its code under the real server.
    try:
        from ts.utils.util import PredictionException as TorchServePredictionException
    except ImportError:
        return Exception
    return TorchServePredictionException


class PredictionException(_prediction_exception_base()):  # type: ignore[misc]
    """Fail the whole batch with an HTTP code, as ``ts.utils.util.PredictionException`` does.

    TorchServe's worker answers every request of the batch with ``error_code`` and
    ``message``. Where torchserve is installed this class is a subclass of TorchServe's, so
    a handler written against handlerkit keeps its error code under the real server.
    """

    def __init__(self, message: str, error_code: int = 500):
        super().__init__(message)
        self.message = message
        self.error_code = error_code

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


class HandlerkitWarning(UserWarning):
    """Diagnostics that are not errors (messages start with ``handlerkit:``)."""


class RequestError(PredictionException, HandlerkitError, ValueError):
    """One request of a batch that a handler cannot decode; names the request index.

    Handlers raise it from ``preprocess`` so that the harness (and the developer) knows which
    request of the batch is at fault. It is a :class:`PredictionException` with code 400, so
    TorchServe answers the client "400 Bad Request" with this message instead of its generic
    "503 Prediction failed" — for every request of the server batch, as any exception does.
    """

    def __init__(self, message: str, request_index: int | None = None, error_code: int = 400):
        super().__init__(message, error_code)
        self.request_index = request_index

    def __str__(self) -> str:
        return self.message
