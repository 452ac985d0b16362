"""The built-in ``image_segmenter`` handler: TorchServe's ImageSegmenter, one bad request at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from handlerkit.errors import HandlerkitError
from handlerkit.handlers._pipeline import IMAGENET_MEAN, IMAGENET_STD, ResizeCropNormalize
from handlerkit.handlers.base import timed
from handlerkit.handlers.vision import VisionHandler
from handlerkit.summaries import describe

__all__ = ["ImageSegmenter"]


class ImageSegmenter(VisionHandler):
    """Image in, per-pixel ``[class, probability]`` out: for each request, ``H`` rows of ``W``
    pairs — the most likely class of the pixel (a float, as TorchServe's ``torch.stack`` of
    indices and probabilities makes it) and its softmax probability.

    The model answers as torchvision's segmentation models do, a dict whose ``"out"`` holds the
    logits ``[N, K, H, W]`` (a plain tensor of that shape is taken too). The preprocessing is
    TorchServe's (Resize 256, CenterCrop 224, ImageNet normalisation), computed the fast way
    (:class:`~handlerkit.handlers._pipeline.ResizeCropNormalize`), so every answer is 224 x 224.
    A request that cannot be read gets ``{"code", "error", "fix"}`` and a 4xx status; the others
    their pixels (TorchServe's fails the whole batch). ``index_to_name.json`` is not read into
    the answer, as in TorchServe: classes are the model's output channels.
    """

    image_processing = ResizeCropNormalize(resize=256, crop=(224, 224), mean=IMAGENET_MEAN, std=IMAGENET_STD)
    #: The v2 metadata: an encoded image, base64, in; its ``[class, probability]`` pairs out, flat
    #: (``H * W * 2`` floats), named after the input as TorchServe's ``kservev2`` envelope names it.
    v2_metadata: ClassVar[dict[str, list[dict[str, Any]]]] = {
        "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "input-0", "datatype": "FP64", "shape": [-1]}],
    }

    @timed
    def postprocess(self, data: Any) -> list[Any]:
        """``[class, probability]`` per pixel per readable request (VisionHandler puts the others' error items back)."""
        if isinstance(data, torch.Tensor) and data.shape[0] == 0:  # nothing was readable
            return []
        probs = torch.nn.functional.softmax(_logits(data), dim=1)
        best = torch.max(probs, dim=1)
        pixels = torch.stack([best.indices.type(best.values.dtype), best.values], dim=3)
        return pixels.tolist()

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        raise HandlerkitError(
            "the request asked for an explanation (header explain: True), but a segmentation model "
            "has no single score per class to attribute (TorchServe's image_segmenter fails on it too)",
            fix="send the request without the explain header",
        )


def _logits(data: Any) -> torch.Tensor:
    """The model's ``out`` logits [N, K, H, W], or an error saying what came instead."""
    logits = data.get("out") if isinstance(data, Mapping) else data
    if isinstance(logits, torch.Tensor) and logits.dim() == 4:
        return logits
    if isinstance(data, Mapping):
        got = f"a dict with keys {sorted(map(str, data))}" if logits is None else f"'out' = {describe(logits)}"
    else:
        got = describe(data)
    raise HandlerkitError(
        f"image_segmenter needs the model to return {{'out': logits [N, classes, H, W]}} (torchvision's "
        f"segmentation format) or that tensor; got {got}",
        fix="return the per-pixel class scores under 'out', or override postprocess",
    )
