"""VisionHandler: TorchServe's image request formats, decoded with request-level errors."""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
from collections.abc import Iterator
from typing import Any

import torch

from handlerkit._optional import require
from handlerkit.errors import RequestError
from handlerkit.handlers.base import BaseHandler, timed
from handlerkit.requests import payload as request_payload

__all__ = ["VisionHandler", "decode_image"]


@contextlib.contextmanager
def _pixel_limit(limited: bool) -> Iterator[None]:
    """TorchServe sets ``Image.MAX_IMAGE_PIXELS = None`` for the whole process when the
    server's ``limit_max_image_pixels`` is false; here the limit is lifted for one decode."""
    from PIL import Image

    if limited:
        yield
        return
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = old


def decode_image(payload: Any, index: int, *, limit_pixels: bool = True) -> Any:
    """One request's image (bytes, bytearray or base64 str) as a PIL image, fully decoded.

    Raises:
        RequestError: naming the request index, what came and how to fix it.
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(payload, str):
        try:
            # Whitespace is dropped first: base64 tools wrap lines (TorchServe's decoder skips it too).
            payload = base64.b64decode("".join(payload.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise RequestError(
                f"request {index}: the body is a str that is not base64 ({exc})",
                index,
                fix="send the image bytes with a binary content type, or base64-encode them",
            ) from exc
    try:
        with _pixel_limit(limit_pixels):
            image = Image.open(io.BytesIO(payload))
            image.load()  # decode now, so a truncated file fails here and not in a transform
    except Image.DecompressionBombError as exc:
        raise RequestError(
            f"request {index}: {exc}",
            index,
            fix="send a smaller image, or set limit_max_image_pixels=False on the server "
            "(MockContext(limit_max_image_pixels=False)) if you trust the source",
        ) from exc
    except UnidentifiedImageError as exc:
        raise RequestError(
            f"request {index}: the {len(payload)}-byte body is not an image PIL can read",
            index,
            fix="send a PNG/JPEG file as the request body",
        ) from exc
    except (OSError, SyntaxError) as exc:
        raise RequestError(
            f"request {index}: the image is corrupt or truncated ({exc})",
            index,
            fix="send the complete image file",
        ) from exc
    return image


class VisionHandler(BaseHandler):
    """Base of the image handlers: each request's ``data`` or ``body`` is an image.

    Accepted per request, as in TorchServe: image bytes (``bytearray``/``bytes``), a base64
    ``str`` of them, or a nested list of floats already shaped like the model input.
    Subclasses set ``image_processing`` (a callable PIL image → tensor). Images in another
    mode (grayscale, palette, RGBA, CMYK, 16-bit) are converted to ``image_mode`` first;
    TorchServe's VisionHandler does not, so its transforms fail on them with a tensor shape
    error. Set ``image_mode = None`` to get images as decoded.
    """

    image_processing: Any = None
    image_mode: str | None = "RGB"

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self.ig = None  # captum's IntegratedGradients, made on the first explanation

    def _limit_pixels(self) -> bool:
        properties = getattr(self.context, "system_properties", None) or {}
        return properties.get("limit_max_image_pixels", True) is not False

    @timed
    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        images = []
        for index, row in enumerate(data):
            payload = request_payload(row)
            if payload is None or (isinstance(payload, (bytes, bytearray, str)) and not payload):
                what = f"got {list(row)}" if isinstance(row, dict) else f"got a {type(row).__name__}"
                empty = "an empty body" if payload is not None else f"no image under 'data' or 'body' ({what})"
                raise RequestError(
                    f"request {index}: {empty}",
                    index,
                    fix="send the image as the request body or as a form field named 'data'",
                )
            if isinstance(payload, (bytes, bytearray, str)):
                image = decode_image(payload, index, limit_pixels=self._limit_pixels())
                if self.image_mode is not None and image.mode != self.image_mode:
                    image = image.convert(self.image_mode)
                images.append(self.image_processing(image))
            elif isinstance(payload, list):
                images.append(torch.as_tensor(payload, dtype=torch.float32))
            else:
                raise RequestError(
                    f"request {index}: a {type(payload).__name__} is not an image",
                    index,
                    fix="send image bytes, a base64 str or a list of floats",
                )
        shapes = {tuple(t.shape) for t in images}
        if len(shapes) > 1:
            raise RequestError(
                f"the batch's images have different shapes after preprocessing {sorted(shapes)}",
                fix="make image_processing resize every image to one size",
            )
        return torch.stack(images).to(self.device)

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        """Integrated gradients for ``target`` (captum), as TorchServe's VisionHandler does."""
        if self.ig is None:
            attr = require("captum.attr", feature="explanations (Integrated Gradients)", pip="pip install captum")
            self.ig = attr.IntegratedGradients(self.model)
        return self.ig.attribute(tensor_data, target=target, n_steps=15).tolist()
