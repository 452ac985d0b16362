"""handlerkit's handlers: the TorchServe-compatible base, the built-in handlers, and
:class:`PerRequestErrors`, which answers one bad request of a batch alone (any handler can mix it in).

Heavy modules (torchvision) are imported on first use of a name.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BaseHandler": "handlerkit.handlers.base",
    "PerRequestErrors": "handlerkit.handlers.request_errors",
    "VisionHandler": "handlerkit.handlers.vision",
    "ImageClassifier": "handlerkit.handlers.image_classifier",
    "ImageSegmenter": "handlerkit.handlers.image_segmenter",
    "ObjectDetector": "handlerkit.handlers.object_detector",
    "TextHandler": "handlerkit.handlers.text",
    "TextClassifier": "handlerkit.handlers.text_classifier",
}

__all__ = [
    "BaseHandler",
    "ImageClassifier",
    "ImageSegmenter",
    "ObjectDetector",
    "PerRequestErrors",
    "TextClassifier",
    "TextHandler",
    "VisionHandler",
]  # what _EXPORTS serves (tests/handlers/test_handlers.py checks it)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'handlerkit.handlers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
