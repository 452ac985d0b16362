"""handlerkit: develop and debug TorchServe-style model handlers in Jupyter.

The names users type are re-exported here and imported lazily, so ``import handlerkit``
stays fast and does not import torch.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from handlerkit import _moved

__version__ = "0.1.0"

logging.getLogger("handlerkit").addHandler(logging.NullHandler())
_moved.install()  # old import paths (handlerkit.context ...) work for one more release, with a warning

_EXPORTS = {
    "MockContext": "handlerkit.worker.context",
    "RequestProcessor": "handlerkit.worker.context",
    "Request": "handlerkit.worker.requests",
    "Batch": "handlerkit.worker.batches",
    "batch": "handlerkit.worker.batches",
    "BaseHandler": "handlerkit.handlers.base",
    "PerRequestErrors": "handlerkit.handlers.request_errors",
    "handlers": "handlerkit.handlers",
    "Harness": "handlerkit.harness",
    "Service": "handlerkit.service",
    "Sequences": "handlerkit.sequences",
    "StageResult": "handlerkit.recording.results",
    "Run": "handlerkit.recording.results",
    "ModelConfig": "handlerkit.worker.config",
    "load_config": "handlerkit.worker.config",
    "resolve_handler": "handlerkit.worker.loading",
    "HandlerkitError": "handlerkit.errors",
    "ConfigError": "handlerkit.errors",
    "HandlerLoadError": "handlerkit.errors",
    "ModelLoadError": "handlerkit.errors",
    "StageError": "handlerkit.errors",
    "PredictionException": "handlerkit.errors",
    "HandlerkitWarning": "handlerkit.errors",
    "RequestError": "handlerkit.errors",
    "send_intermediate_predict_response": "handlerkit.worker.streaming",
    "Stepper": "handlerkit.widgets",
    "show": "handlerkit.viz",
    "summary": "handlerkit.viz",
}

# Literal, so tools read it; tests/test_imports.py checks it names exactly what _EXPORTS serves.
__all__ = [
    "BaseHandler",
    "Batch",
    "ConfigError",
    "HandlerLoadError",
    "HandlerkitError",
    "HandlerkitWarning",
    "Harness",
    "MockContext",
    "ModelConfig",
    "ModelLoadError",
    "PerRequestErrors",
    "PredictionException",
    "Request",
    "RequestError",
    "RequestProcessor",
    "Run",
    "Sequences",
    "Service",
    "StageError",
    "StageResult",
    "Stepper",
    "__version__",
    "batch",
    "handlers",
    "load_config",
    "resolve_handler",
    "send_intermediate_predict_response",
    "show",
    "summary",
]

if TYPE_CHECKING:  # pragma: no cover
    from handlerkit import handlers as handlers
    from handlerkit.errors import ConfigError as ConfigError
    from handlerkit.errors import HandlerkitError as HandlerkitError
    from handlerkit.errors import HandlerkitWarning as HandlerkitWarning
    from handlerkit.errors import HandlerLoadError as HandlerLoadError
    from handlerkit.errors import ModelLoadError as ModelLoadError
    from handlerkit.errors import PredictionException as PredictionException
    from handlerkit.errors import RequestError as RequestError
    from handlerkit.errors import StageError as StageError
    from handlerkit.handlers.base import BaseHandler as BaseHandler
    from handlerkit.handlers.request_errors import PerRequestErrors as PerRequestErrors
    from handlerkit.harness import Harness as Harness
    from handlerkit.recording.results import Run as Run
    from handlerkit.recording.results import StageResult as StageResult
    from handlerkit.sequences import Sequences as Sequences
    from handlerkit.service import Service as Service
    from handlerkit.viz import show as show
    from handlerkit.viz import summary as summary
    from handlerkit.widgets import Stepper as Stepper
    from handlerkit.worker.batches import Batch as Batch
    from handlerkit.worker.batches import batch as batch
    from handlerkit.worker.config import ModelConfig as ModelConfig
    from handlerkit.worker.config import load_config as load_config
    from handlerkit.worker.context import MockContext as MockContext
    from handlerkit.worker.context import RequestProcessor as RequestProcessor
    from handlerkit.worker.loading import resolve_handler as resolve_handler
    from handlerkit.worker.requests import Request as Request
    from handlerkit.worker.streaming import send_intermediate_predict_response as send_intermediate_predict_response


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'handlerkit' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if name == "handlers" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
