"""handlerkit: develop and debug TorchServe-style model handlers in Jupyter.

The names users type are re-exported here and imported lazily, so ``import handlerkit``
stays fast and does not import torch.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

logging.getLogger("handlerkit").addHandler(logging.NullHandler())

_EXPORTS = {
    "MockContext": "handlerkit.context",
    "RequestProcessor": "handlerkit.context",
    "Request": "handlerkit.requests",
    "Batch": "handlerkit.batches",
    "batch": "handlerkit.batches",
    "BaseHandler": "handlerkit.handlers.base",
    "handlers": "handlerkit.handlers",
    "Harness": "handlerkit.harness",
    "Service": "handlerkit.service",
    "StageResult": "handlerkit.results",
    "Run": "handlerkit.results",
    "ModelConfig": "handlerkit.config",
    "load_config": "handlerkit.config",
    "resolve_handler": "handlerkit.loading",
    "HandlerkitError": "handlerkit.errors",
    "ConfigError": "handlerkit.errors",
    "HandlerLoadError": "handlerkit.errors",
    "ModelLoadError": "handlerkit.errors",
    "StageError": "handlerkit.errors",
    "PredictionException": "handlerkit.errors",
    "HandlerkitWarning": "handlerkit.errors",
    "RequestError": "handlerkit.errors",
    "Stepper": "handlerkit.widgets",
    "show": "handlerkit.viz",
    "summary": "handlerkit.viz",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from handlerkit import handlers
    from handlerkit.config import ModelConfig, load_config
    from handlerkit.context import MockContext, RequestProcessor
    from handlerkit.errors import (
        ConfigError,
        HandlerkitError,
        HandlerkitWarning,
        HandlerLoadError,
        ModelLoadError,
        PredictionException,
        StageError,
    )
    from handlerkit.handlers.base import BaseHandler
    from handlerkit.harness import Harness
    from handlerkit.service import Service
    from handlerkit.results import Run, StageResult
    from handlerkit.loading import resolve_handler
    from handlerkit.batches import Batch, batch
    from handlerkit.requests import Request
    from handlerkit.viz import show, summary
    from handlerkit.widgets import Stepper


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
