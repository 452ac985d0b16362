"""The built-in ``image_classifier`` handler: TorchServe's ImageClassifier, top-k capped, faster."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from handlerkit.handlers._pipeline import IMAGENET_MEAN, IMAGENET_STD, ResizeCropNormalize
from handlerkit.handlers.base import timed
from handlerkit.handlers.vision import VisionHandler

__all__ = ["ImageClassifier"]


class ImageClassifier(VisionHandler):
    """Image in, ``{label: probability}`` for the top-k classes out (one dict per request).

    The preprocessing is TorchServe's (Resize 256, CenterCrop 224, ImageNet normalisation),
    computed batched (:class:`~handlerkit.handlers._pipeline.ResizeCropNormalize`: images
    decoded, resized and normalised in parallel, the short side's crop resampled alone): the
    same tensors, bit for bit, so the same answers. ``topk`` is 5 as in TorchServe, or ``handler: {topk: N}`` in model-config.yaml,
    and is capped at the number of classes (TorchServe's fails on models with fewer than 5).
    A request that cannot be read gets ``{"code", "error", "fix"}`` and a 4xx status; the
    others their top-k.
    """

    topk = 5
    check_label_map_width = True
    image_processing = ResizeCropNormalize(resize=256, crop=(224, 224), mean=IMAGENET_MEAN, std=IMAGENET_STD)
    #: The v2 metadata (``GET /v2/models/<name>`` on ``handlerkit serve --engine kserve``): an encoded
    #: image, base64, in; its ``{label: probability}`` out, one element named after the input
    #: (TorchServe's ``kservev2`` envelope names output ``i`` after input ``i``).
    v2_metadata: ClassVar[dict[str, list[dict[str, Any]]]] = {
        "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "input-0", "datatype": "BYTES", "shape": [1]}],
    }

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
    def postprocess(self, data: torch.Tensor) -> list[dict[str, Any]]:
        """Top-k ``{label: probability}`` per readable request (VisionHandler puts the others' error items back)."""
        if data.shape[0] == 0:  # no request was readable: inference passed the empty batch through
            return []
        probs = F.softmax(data, dim=1)
        k = min(self.topk, probs.shape[1])
        top_probs, top_classes = torch.topk(probs, k, dim=1)
        mapping = self.mapping
        return [
            {(mapping[str(c)] if mapping is not None else str(c)): p for c, p in zip(classes, ps)}
            for classes, ps in zip(top_classes.tolist(), top_probs.tolist())
        ]
