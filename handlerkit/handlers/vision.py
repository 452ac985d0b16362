"""VisionHandler: TorchServe's image request formats, decoded in parallel, one bad request at a time.

What a request may hold, as in TorchServe: image bytes (``bytes``/``bytearray``), a base64
``str`` of them, or a (JSON) nested list of floats already shaped like the model input; and,
where no HTTP is involved (``Request.from_data``), a tensor or a PIL image.

Unlike TorchServe's VisionHandler:

* **one bad request fails alone**: a request that cannot be read (empty, not an image, corrupt,
  truncated, too many pixels, base64 that is not, a list of the wrong shape) gets an error item
  ``{"code", "error", "fix"}`` and a 4xx status through ``context.set_response_status``, and
  the others are answered (TorchServe's fails the whole batch);
* ``limit_max_image_pixels`` refuses an image of more than ``PIL.Image.MAX_IMAGE_PIXELS``
  pixels from its header, before decoding it, with 413 (PIL itself only warns up to twice that);
* images in other modes (grayscale, palette, 16-bit, CMYK, with alpha) are converted to
  ``image_mode`` first: 16-bit scaled to 8 bits, transparency composited over
  ``alpha_background`` (TorchServe's transforms fail on them with a tensor shape error);
* images are decoded by PIL (never ``torchvision.io``, which can crash the process on a
  malformed PNG) in ``decode_threads`` threads, and when ``image_processing`` is TorchServe's
  Resize → CenterCrop → ToTensor → Normalize (a :class:`ResizeCropNormalize`, or that torchvision
  ``Compose``), it runs batched (:mod:`handlerkit.handlers._pipeline`), with TorchServe's pixels
  and arithmetic: the same tensors, bit for bit.

``handler:`` keys read from model-config.yaml: ``decode_threads`` (default: ``torch.get_num_threads()``),
and two opt-ins that are faster but change pixels, so the answers are no longer TorchServe's:
``jpeg_draft`` (reduced-size JPEG decoding) and ``fast_resize`` (downscales by torch's uint8
kernel, ±1 on some pixels).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from handlerkit._optional import require
from handlerkit.errors import ConfigError, RequestError
from handlerkit.handlers._decode import convert_mode, image_bytes, load_image, open_image
from handlerkit.handlers._pipeline import ResizeCropNormalize, pipeline_from
from handlerkit.handlers.base import BaseHandler, HandlerDecisions, timed
from handlerkit.handlers.request_errors import request_error
from handlerkit.worker.batches import payload as request_payload

__all__ = ["ResizeCropNormalize", "VisionHandler", "decode_image"]


def decode_image(payload: Any, index: int, *, limit_pixels: bool = True) -> Any:
    """One request's image (bytes, bytearray or base64 str) as a PIL image, fully decoded.

    Raises:
        RequestError: naming the request index, what came and how to fix it.
    """
    image = open_image(image_bytes(payload, index), index, limit_pixels=limit_pixels)
    return load_image(image, index)


class VisionHandler(BaseHandler):
    """Base of the image handlers: each request's ``data`` or ``body`` is an image.

    Hooks for subclasses (TorchServe's names first):

    * ``image_processing``: a PIL image → tensor callable, run per image; TorchServe's
      Resize/CenterCrop/ToTensor/Normalize ``Compose`` (or a :class:`ResizeCropNormalize`)
      runs batched instead (:func:`~handlerkit.handlers._pipeline.pipeline_from`);
    * ``image_mode`` (``"RGB"``): the mode images are converted to; None keeps them as decoded;
    * ``alpha_background`` (white): what transparent pixels are composited over; None drops alpha;
    * ``decode_threads`` / ``jpeg_draft`` / ``fast_resize``: see the module docstring;
    * :meth:`preprocess` returns the tensor of the readable requests only; each other one is
      refused (:meth:`~handlerkit.handlers.request_errors.PerRequestErrors.refuse`, from
      BaseHandler): :attr:`refused` (also :attr:`request_errors`) maps its index to its
      :class:`RequestError`, and its error item is put back among the answers of any subclass's
      ``postprocess`` and ``explain_handle``, even one written for TorchServe's VisionHandler
      (one item per tensor row). A subclass refuses more with ``self.refuse(index, ...)``.

    When no request of a batch is readable, ``inference`` and ``postprocess`` do not run: the
    batch is answered with the error items (the model never sees an empty batch).
    """

    image_processing: Any = None
    image_mode: str | None = "RGB"
    alpha_background: tuple[int, int, int] | None = (255, 255, 255)
    decode_threads: int | None = None
    jpeg_draft: bool = False
    fast_resize: bool = False

    def __init__(self) -> None:
        super().__init__()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_size = 0
        self._executor_pid = 0

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the decode threads behind (they make their own on first use)."""
        state = self.__dict__.copy()
        state.update(_executor=None, _executor_size=0, _executor_pid=0)
        return state

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.ig: Any = None  # captum's IntegratedGradients, made on the first explanation

    def _initialize(self, context: Any, decisions: HandlerDecisions) -> None:
        super()._initialize(context, decisions)
        cls = type(self)
        threads = self.settings.get("decode_threads", cls.decode_threads)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(
                f"handler.decode_threads must be a positive integer, got {threads!r}",
                fix="write e.g. decode_threads: 2, or leave it out for torch.get_num_threads()",
            )
        draft, fast = (self._flag(key, getattr(cls, key)) for key in ("jpeg_draft", "fast_resize"))
        self.decode_threads, self.jpeg_draft, self.fast_resize = threads, draft, fast
        if draft:
            decisions.notes.append(
                "jpeg_draft: JPEGs are decoded at reduced size where the resize allows "
                "(faster; pixels differ from TorchServe's)"
            )
        if fast:
            decisions.notes.append(
                "fast_resize: downscales by torch's uint8 kernel instead of PIL's "
                "(faster; some pixels differ from TorchServe's by 1)"
            )

    def _flag(self, key: str, default: bool) -> bool:
        value = self.settings.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"handler.{key} must be true or false, got {value!r}", fix=f"write {key}: true")
        return value

    def _limit_pixels(self) -> bool:
        properties = getattr(self.context, "system_properties", None) or {}
        return properties.get("limit_max_image_pixels", True) is not False

    @property
    def request_errors(self) -> dict[int, RequestError]:
        """:attr:`refused`, by its earlier name: index → :class:`RequestError` of this batch."""
        return self.refused

    # -------------------------------------------------------------- the batch
    def _pool(self, jobs: int) -> concurrent.futures.ThreadPoolExecutor | None:
        threads = min(self.decode_threads or torch.get_num_threads(), jobs)
        if threads < 2:
            return None
        executor = getattr(self, "_executor", None)  # None too where a subclass skipped __init__
        # A forked child inherits the executor but not its threads: it makes its own.
        if executor is None or self._executor_size < threads or self._executor_pid != os.getpid():
            if executor is not None and self._executor_pid == os.getpid():
                executor.shutdown(wait=False)
            self._executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="handlerkit-decode")
            self._executor_size, self._executor_pid = threads, os.getpid()
        return self._executor

    def _map(self, work: Callable[[Any], Any], jobs: Sequence[Any]) -> list[Any]:
        """``work(job)`` for each job, in order, on the decode threads; a RequestError is
        returned in place of its result, anything else raised is raised here."""

        def guarded(job: Any) -> Any:
            try:
                return work(job)
            except RequestError as exc:
                return exc

        pool = self._pool(len(jobs))
        if pool is None:
            return [guarded(job) for job in jobs]
        return list(pool.map(guarded, jobs))

    def _pipeline(self) -> ResizeCropNormalize | None:
        if self.image_mode != "RGB":
            return None
        pipeline = pipeline_from(self.image_processing)
        if pipeline is None:
            return None
        return pipeline.with_options(draft=self.jpeg_draft, fast_resize=self.fast_resize)

    @timed
    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        """The readable requests' images as one batch tensor; the others get their error
        (:attr:`refused`) and a 4xx status here."""
        pipeline = self._pipeline()
        limit = self._limit_pixels()
        opened: list[tuple[int, Any, tuple[int, int]]] = []
        lists: dict[int, Any] = {}
        for index, row in enumerate(data):
            try:
                payload = request_payload(row)
                if payload is None:
                    got = f"got {sorted(row)}" if isinstance(row, dict) else f"got a {type(row).__name__}"
                    raise request_error(
                        index,
                        f"no image under 'data' or 'body' ({got})",
                        "send the image as the request body or as a form field named 'data'",
                    )
                if isinstance(payload, (list, torch.Tensor)):  # floats shaped like the model input
                    lists[index] = payload
                    continue
                if _is_pil_image(payload):  # Request.from_data({"body": image}): already decoded
                    image = payload
                else:
                    image = open_image(image_bytes(payload, index), index, limit_pixels=limit)
                full_size = pipeline.prepare(image) if pipeline is not None else image.size
                opened.append((index, image, full_size))
            except RequestError as exc:
                self.refuse(index, exc)

        mode, background = self.image_mode, self.alpha_background
        # With a fixed output shape, each thread normalises its images into their rows of the batch.
        rows_out = _batch_array(pipeline, len(opened))

        def decode(job: tuple[int, tuple[int, Any, tuple[int, int]]]) -> Any:
            slot, (index, image, full_size) = job
            image = load_image(image, index)
            try:
                image = convert_mode(image, mode, background)
            except (ValueError, OSError) as exc:  # e.g. LAB or HSV, which PIL cannot turn into RGB
                raise request_error(
                    index,
                    f"a {image.mode} image cannot be converted to {mode} ({exc})",
                    "send an RGB, grayscale or palette image",
                ) from exc
            if pipeline is None:
                return image
            pixels = pipeline.to_uint8(image, full_size)
            if rows_out is None:
                return pixels
            pipeline.normalize_into(pixels, rows_out[slot])
            return slot

        decoded = self._map(decode, list(enumerate(opened)))
        good = []
        for (index, _, _), result in zip(opened, decoded):
            if isinstance(result, RequestError):
                self.refuse(index, result)
            else:
                good.append((index, result))
        if rows_out is not None:
            kept = rows_out if len(good) == len(opened) else rows_out[[slot for _, slot in good]]
            batch = torch.from_numpy(kept)
            rows = {index: batch[i] for i, (index, _) in enumerate(good)}
        elif pipeline is not None:
            batch = self._normalized(pipeline, [pixels for _, pixels in good])
            rows = {index: batch[i] for i, (index, _) in enumerate(good)}
        else:
            batch = None
            rows = {index: self.image_processing(image) for index, image in good}
        expected = self._expected_shape(pipeline, rows)
        for index, values in lists.items():
            try:
                rows[index] = _float_tensor(values, index, expected)
            except RequestError as exc:
                self.refuse(index, exc)
        if batch is not None and len(rows) == len(good):  # images only: the batch as normalised
            return batch.to(self.device)
        return self._stack([rows[i] for i in sorted(rows)], expected)

    def _expected_shape(
        self, pipeline: ResizeCropNormalize | None, rows: dict[int, torch.Tensor]
    ) -> tuple[int, ...] | None:
        """The shape every request's tensor must have (a list of floats of another shape fails
        alone): the pipeline's output, else the first image's; None lets shapes differ."""
        if pipeline is not None and pipeline.output_shape is not None:
            return pipeline.output_shape
        return tuple(next(iter(rows.values())).shape) if rows else None

    def _normalized(self, pipeline: ResizeCropNormalize, images: list[torch.Tensor]) -> torch.Tensor:
        shapes = {tuple(pixels.shape) for pixels in images}
        if len(shapes) > 1:
            raise RequestError(
                f"the batch's images have different shapes after preprocessing {sorted(shapes)}",
                fix="make image_processing resize or crop every image to one size",
            )
        if not images:
            return torch.empty((0, *(pipeline.output_shape or ())))
        return pipeline.normalize(images)

    def _stack(self, tensors: list[torch.Tensor], expected: tuple[int, ...] | None) -> torch.Tensor:
        if not tensors:
            return torch.empty((0, *(expected or ())), device=self.device)
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            raise RequestError(
                f"the batch's images have different shapes after preprocessing {sorted(shapes)}",
                fix="make image_processing resize every image to one size",
            )
        return torch.stack(tensors).to(self.device)

    @timed
    def postprocess(self, data: Any) -> list[Any]:
        """``data.tolist()`` for the readable requests (the others' error items are put back)."""
        return data.tolist()

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        """Integrated gradients for ``target`` (captum), as TorchServe's VisionHandler does."""
        if self.ig is None:
            attr = require("captum.attr", feature="explanations (Integrated Gradients)", pip="pip install captum")
            self.ig = attr.IntegratedGradients(self.model)
        return self.ig.attribute(tensor_data, target=target, n_steps=15).tolist()


def _batch_array(pipeline: ResizeCropNormalize | None, count: int) -> Any:
    """An uninitialised float32 numpy batch for ``count`` images of the pipeline's output
    shape, or None when images may differ in shape (then they are normalised once decoded)."""
    if pipeline is None or pipeline.output_shape is None or not count:
        return None
    import numpy as np

    return np.empty((count, *pipeline.output_shape), dtype=np.float32)


def _is_pil_image(value: Any) -> bool:
    image_module = sys.modules.get("PIL.Image")
    return image_module is not None and isinstance(value, image_module.Image)


def _float_tensor(values: Any, index: int, expected: tuple[int, ...] | None) -> torch.Tensor:
    """A request's JSON list of floats (or tensor) as a float32 tensor of the model input's shape."""
    try:
        tensor = torch.as_tensor(values, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise request_error(
            index,
            f"the JSON list is not a rectangular array of numbers ({exc})",
            "send the image itself, or a nested list of floats shaped like the model input",
        ) from exc
    if expected is not None and tuple(tensor.shape) != tuple(expected):
        raise request_error(
            index,
            f"a list of floats of shape {list(tensor.shape)}; the model input is {list(expected)}",
            f"send the image itself, or a nested list of floats of shape {list(expected)}",
        )
    return tensor
