"""The built-in ``object_detector`` handler: TorchServe's ObjectDetector, images of any size, one
bad request at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from handlerkit.errors import ConfigError, HandlerkitError
from handlerkit.handlers.base import HandlerDecisions, timed
from handlerkit.handlers.vision import VisionHandler
from handlerkit.summaries import describe

__all__ = ["ObjectDetector"]

_KEYS = ("boxes", "labels", "scores")


def _to_tensor(image: Any) -> torch.Tensor:
    """torchvision's ``ToTensor()`` on a decoded PIL image, in its arithmetic: ``float32 [C, H, W]`` in [0, 1]."""
    import numpy as np

    pixels = torch.from_numpy(np.array(image, copy=True))
    if pixels.dim() == 2:
        pixels = pixels[:, :, None]
    return pixels.permute(2, 0, 1).contiguous().to(torch.float32).div(255)


class ObjectDetector(VisionHandler):
    """Image in, detections out: for each request a list of ``{label: [x1, y1, x2, y2], "score": s}``,
    one per box scoring at least ``threshold``, in the model's order (TorchServe's format).

    The model answers as torchvision's detection models do: one dict per image with ``"boxes"``
    float ``[k, 4]``, ``"labels"`` int ``[k]`` and ``"scores"`` float ``[k]``. Labels are named by
    ``index_to_name.json`` (label 0 is usually ``__background__``); a label it lacks stays a number.
    The preprocessing is TorchServe's, ``ToTensor()`` only, so each image keeps its own size: a
    batch of one size reaches the model as one tensor ``[N, 3, H, W]``, as in TorchServe, and a
    batch of several sizes as a list of ``[3, H, W]`` tensors, which torchvision's detection models
    take too (TorchServe's fails, as it cannot stack them). A request that cannot be read gets
    ``{"code", "error", "fix"}`` and a 4xx status; the others their boxes.

    ``threshold`` is 0.5 as in TorchServe, or ``handler: {threshold: x}`` in model-config.yaml.
    """

    threshold = 0.5
    image_processing = staticmethod(_to_tensor)
    #: The v2 metadata: an encoded image, base64, in; one ``{label: box, "score": s}`` per detection
    #: out, named after the input as TorchServe's ``kservev2`` envelope names it.
    v2_metadata: ClassVar[dict[str, list[dict[str, Any]]]] = {
        "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
    }

    def _initialize(self, context: Any, decisions: HandlerDecisions) -> None:
        super()._initialize(context, decisions)
        # The class default when the config has none, so a re-initialize drops an old value.
        threshold = self.settings.get("threshold", type(self).threshold)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ConfigError(
                f"handler.threshold must be a number from 0 to 1 (the lowest score of a box that is returned), "
                f"got {threshold!r}",
                fix="write e.g. 'handler: {threshold: 0.5}'",
            )
        self.threshold = float(threshold)
        decisions.notes.append(f"threshold {self.threshold}: boxes scoring less are left out of the answers")

    # -------------------------------------------------------------- the batch
    def _pipeline(self) -> Any:
        # The batched fast path needs one output size; without a resize in image_processing the
        # images go through it one by one and keep their sizes.
        pipeline = super()._pipeline()
        return pipeline if pipeline is not None and pipeline.output_shape is not None else None

    def _stack(self, tensors: list[torch.Tensor], expected: tuple[int, ...] | None) -> Any:
        """The readable requests' images (in request order) as the model's input: one tensor when
        they have one size, else a list; a request whose tensor is not ``[C, H, W]`` fails alone."""
        errors = self.refused
        readable = [i for i in range(len(tensors) + len(errors)) if i not in errors]
        kept = []
        for index, tensor in zip(readable, tensors):
            if tensor.dim() != 3:
                self.refuse(
                    index,
                    f"a list of floats of shape {list(tensor.shape)} is not an image [channels, height, width]",
                    fix="send the image itself, or a nested list of floats shaped [3, height, width]",
                )
            else:
                kept.append(tensor)
        if not kept:
            return torch.empty((0, 3, 0, 0), device=self.device)
        if len({tuple(t.shape) for t in kept}) == 1:
            return torch.stack(kept).to(self.device)
        return [t.to(self.device) for t in kept]

    # -------------------------------------------------------------- the answers
    @timed
    def postprocess(self, data: Any) -> list[Any]:
        """The boxes scoring at least ``threshold`` per readable request (VisionHandler puts the others' error
        items back)."""
        if isinstance(data, torch.Tensor) and data.shape[0] == 0:  # nothing was readable
            return []
        mapping = self.mapping
        answers = []
        for image, row in enumerate(_detections(data)):
            keep = row["scores"] >= self.threshold
            boxes, labels, scores = (row[key][keep].tolist() for key in _KEYS)
            if not len(boxes) == len(labels) == len(scores):
                raise HandlerkitError(
                    f"the model's detections for image {image} have {len(boxes)} boxes, {len(labels)} labels "
                    f"and {len(scores)} scores above the threshold; they must be one each per detection",
                    fix="return boxes [k, 4], labels [k] and scores [k] for the same k",
                )
            answers.append(
                [
                    {(mapping.get(str(label), str(label)) if mapping is not None else str(label)): box, "score": score}
                    for box, label, score in zip(boxes, labels, scores)
                ]
            )
        return answers

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        raise HandlerkitError(
            "the request asked for an explanation (header explain: True), but a detection model has no "
            "single score per class to attribute (TorchServe's object_detector fails on it too)",
            fix="send the request without the explain header",
        )


def _detections(data: Any) -> list[Mapping[str, torch.Tensor]]:
    """The model's per-image detection dicts, or an error saying what came instead."""
    if isinstance(data, (list, tuple)) and all(
        isinstance(row, Mapping) and all(isinstance(row.get(key), torch.Tensor) for key in _KEYS) for row in data
    ):
        return list(data)
    raise HandlerkitError(
        "object_detector needs the model to return one dict per image with tensors 'boxes' [k, 4], "
        f"'labels' [k] and 'scores' [k] (torchvision's detection format); got {describe(data)}"
        + (
            f" (first: {sorted(map(str, data[0]))})"
            if isinstance(data, (list, tuple)) and data and isinstance(data[0], Mapping)
            else ""
        ),
        fix="return that list from the model's forward, or override postprocess",
    )
