"""The built-in ``image_classifier`` handler: TorchServe's ImageClassifier, top-k capped."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from handlerkit.handlers.base import timed
from handlerkit.handlers.vision import VisionHandler

__all__ = ["ImageClassifier"]


def _imagenet_transform() -> Any:
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


class ImageClassifier(VisionHandler):
    """Image in, ``{label: probability}`` for the top-k classes out (one dict per request).

    The preprocessing is TorchServe's (Resize 256, CenterCrop 224, ImageNet normalisation).
    ``topk`` is 5 as in TorchServe, or ``handler: {topk: N}`` in model-config.yaml, and is
    capped at the number of classes (TorchServe's fails on models with fewer than 5).
    """

    topk = 5
    check_label_map_width = True

    def __init__(self) -> None:
        super().__init__()
        self.image_processing = _imagenet_transform()

    def initialize(self, context: Any) -> None:
        super().initialize(context)  # validates handler.topk with the rest of the config
        # The class default when the config has none, so a re-initialize drops an old value.
        topk = self.settings.topk
        self.topk = topk if topk is not None else type(self).topk

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    @timed
    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        probs = F.softmax(data, dim=1)
        k = min(self.topk, probs.shape[1])
        top_probs, top_classes = torch.topk(probs, k, dim=1)
        mapping = self.mapping
        return [
            {(mapping[str(c)] if mapping is not None else str(c)): p for c, p in zip(classes, ps)}
            for classes, ps in zip(top_classes.tolist(), top_probs.tolist())
        ]
