"""One request's image: payload checks, a pixel limit read from the header, decoding, colour modes.

Decoding is PIL's for every format. ``torchvision.io.decode_image`` (0.29) is not used: it kills
the process with a segmentation fault on some malformed PNGs (a valid header with too little
pixel data), which no ``except`` can catch. The steps are split so that a batch can open every
header in the calling thread (cheap, and where PIL's process-wide pixel limit may be touched)
and decode in worker threads (PIL releases the GIL while it decodes and resamples).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import re
import warnings
from collections.abc import Iterator
from typing import Any

from handlerkit.errors import RequestError
from handlerkit.handlers.request_errors import payload_kind, request_error

__all__ = ["convert_mode", "image_bytes", "load_image", "open_image", "pixel_limit"]

_SIXTEEN_BIT = {"I;16", "I;16B", "I;16L", "I;16N"}
_SEND_AN_IMAGE = "send a PNG/JPEG file as the request body (or a form field named 'data')"


def image_bytes(payload: Any, index: int) -> bytes | bytearray:
    """The encoded image of a request's payload: bytes as sent, a ``str`` base64-decoded.

    Raises:
        RequestError: an empty body, a str that is not base64, or a JSON value that is no image.
    """
    if isinstance(payload, memoryview):
        payload = bytes(payload)
    if isinstance(payload, str):
        if payload.lstrip().startswith("data:") and "," in payload:
            raise request_error(
                index,
                "the body is a data URL, not base64 alone",
                "send only what follows the comma (the base64 part), or the image bytes themselves",
            )
        try:
            # Whitespace is dropped first: base64 tools wrap lines (TorchServe's decoder skips it too).
            decoded = base64.b64decode("".join(payload.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise request_error(
                index,
                f"the body is a str that is not base64 ({exc})",
                "send the image bytes with a binary content type, or base64-encode them",
            ) from exc
        if not decoded:
            raise request_error(index, "the body is empty", _SEND_AN_IMAGE)
        return decoded
    if isinstance(payload, (bytes, bytearray)):
        if not payload:
            raise request_error(
                index, "an empty body", "send the image as the request body or as a form field named 'data'"
            )
        return payload
    raise request_error(
        index, f"{payload_kind(payload)} is not an image", "send image bytes, a base64 str or a list of floats"
    )


@contextlib.contextmanager
def pixel_limit(limited: bool) -> Iterator[None]:
    """TorchServe sets ``Image.MAX_IMAGE_PIXELS = None`` for the whole process when the
    server's ``limit_max_image_pixels`` is false; here the limit is lifted for one open."""
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


def _too_large(index: int, what: str) -> RequestError:
    return request_error(
        index,
        what,
        "send a smaller image, or set limit_max_image_pixels=false on the server "
        "(MockContext(limit_max_image_pixels=False)) if you trust the source",
        413,
    )


def open_image(data: bytes | bytearray, index: int, *, limit_pixels: bool = True) -> Any:
    """The image's header, read by PIL; nothing is decoded yet.

    With ``limit_pixels``, an image of more than ``PIL.Image.MAX_IMAGE_PIXELS`` pixels is
    refused from its header (PIL itself only warns up to twice that many). Call it from one
    thread at a time: PIL's limit and warning filters are process-wide.

    Raises:
        RequestError: not an image PIL can read (400), or too many pixels (413).
    """
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below instead
        try:
            with pixel_limit(limit_pixels):
                image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as exc:
            # PIL refuses above twice its limit and names that in its message; say it our way.
            found = re.search(r"\((\d+) pixels\)", str(exc))
            pixels = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
            raise _too_large(
                index, f"the image has {pixels}, more than the limit of {int(Image.MAX_IMAGE_PIXELS or 0):,}"
            ) from exc
        except MemoryError:
            raise
        except Exception as exc:  # UnidentifiedImageError, and what broken headers raise (SyntaxError, ...)
            detail = "" if isinstance(exc, Image.UnidentifiedImageError) else f" ({type(exc).__name__}: {exc})"
            raise request_error(
                index, f"the {len(data)}-byte body is not an image PIL can read{detail}", _SEND_AN_IMAGE
            ) from exc
    limit = Image.MAX_IMAGE_PIXELS
    width, height = image.size
    if limit_pixels and limit is not None and width * height > limit:
        image.close()
        raise _too_large(
            index,
            f"the image has {width * height:,} pixels ({width} x {height}), more than the limit of {int(limit):,}",
        )
    return image


def load_image(image: Any, index: int) -> Any:
    """Decode an opened image (thread-safe: one image per thread).

    Raises:
        RequestError: the data is corrupt or truncated (whatever PIL's decoder raised).
    """
    try:
        image.load()
    except MemoryError:
        raise
    except Exception as exc:  # OSError, SyntaxError, ValueError, EOFError, zlib/struct errors...
        raise request_error(
            index, f"the image is corrupt or truncated ({type(exc).__name__}: {exc})", "send the complete image file"
        ) from exc
    return image


def convert_mode(image: Any, mode: str | None, background: tuple[int, int, int] | None = (255, 255, 255)) -> Any:
    """``image`` in ``mode`` (None: as decoded), without PIL's conversion surprises.

    * 16-bit grayscale is scaled to 8 bits (PIL's ``convert`` clips everything above 255 to white);
    * transparency (an alpha channel, or a transparent palette entry) is composited over
      ``background`` (None: the alpha channel is dropped, as PIL's ``convert`` does).
    """
    from PIL import Image

    if mode is None or image.mode == mode:
        return image
    if image.mode in _SIXTEEN_BIT:
        import numpy as np

        wide = np.asarray(image).astype(np.uint32)
        image = Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8), "L")
    elif background is not None and mode in ("RGB", "L") and _has_transparency(image):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        image = Image.alpha_composite(canvas, rgba)
    return image if image.mode == mode else image.convert(mode)


def _has_transparency(image: Any) -> bool:
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        return True
    return "transparency" in image.info
