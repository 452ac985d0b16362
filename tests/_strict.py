"""A handler that fails the whole batch on a bad image, as TorchServe's vision handlers do
(handlerkit's built-ins answer the bad request alone): tests of stage errors use it."""

from __future__ import annotations

from typing import Any

from handlerkit.handlers.image_classifier import ImageClassifier


class Strict(ImageClassifier):
    """The built-in classifier, raising the first request error its preprocess recorded."""

    def preprocess(self, data: Any) -> Any:
        images = super().preprocess(data)
        if self.request_errors:
            raise next(iter(self.request_errors.values()))
        return images
