"""TorchServe's image preprocessing (Resize → CenterCrop → ToTensor → Normalize), the fast way.

TorchServe's ImageClassifier runs ``transforms.Compose([Resize(256), CenterCrop(224),
ToTensor(), Normalize(mean, std)])`` on each PIL image. :class:`ResizeCropNormalize` gives the
same tensor with less work:

* an image larger than the target is resized by torch's uint8 antialiased bilinear kernel
  (``F.interpolate(..., antialias=True)`` on a channels-last uint8 tensor), which implements
  PIL's algorithm in the same fixed-point arithmetic, about ten times faster than PIL on one
  core; the result is PIL's but for a ±1 on a few pixels (0.3 % of a 1280×960 photo, none on
  the fixture images). Smaller images (an upscale) go through PIL, pixel for pixel TorchServe's;
* images stay uint8 until the whole batch is converted at once, with TorchServe's own
  arithmetic (``/255``, ``-mean``, ``/std`` in float32), so equal pixels give equal floats
  (TorchServe makes two float copies per image, each op a wake-up of torch's thread pool);
* opt-in (``draft=True``): a JPEG is decoded at 1/2, 1/4 or 1/8 scale when the resize target
  allows (libjpeg's DCT scaling, PIL's ``Image.draft``); faster, but the pixels differ.

:func:`pipeline_from` recognises the torchvision ``Compose`` handlers are written with, so a
TorchServe handler's own ``image_processing`` gets the fast path too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ResizeCropNormalize", "pipeline_from"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Above this many pixels an image is resized by PIL: torch's kernel needs a uint8 copy of it.
_TORCH_RESIZE_MAX_PIXELS = 2**25


def _chw(image: Any) -> torch.Tensor:
    """An RGB PIL image as ``uint8 [3, h, w]`` (a channels-last view of one writable copy)."""
    import numpy as np

    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def _axis(resized: int, crop: int | None) -> tuple[int, int, int]:
    """One axis of torchvision's CenterCrop on a ``resized``-long image: (first source pixel,
    pixels kept, offset in the output). A crop longer than the image pads it with zeros."""
    if crop is None:
        return 0, resized, 0
    if crop > resized:
        return 0, resized, (crop - resized) // 2
    return round((resized - crop) / 2.0), crop, 0  # torchvision's rounding, half to even


@dataclass(frozen=True)
class ResizeCropNormalize:
    """A PIL image → TorchServe's normalised ``float32 [3, H, W]`` tensor, batchable.

    Attributes:
        resize: torchvision ``Resize``'s size: an int resizes the shorter side to it (the
            longer one in proportion, truncated), ``(h, w)`` resizes to exactly that; None: no resize.
        crop: ``(h, w)`` of the centre crop (zero-padded when larger than the image); None: no crop.
        mean, std: per-channel normalisation after scaling to [0, 1]; None: no normalisation.
        draft: decode JPEGs at reduced size when the resize allows (changes pixels; off by default).

    Calling it on one image gives what the torchvision pipeline gives; a handler calls
    :meth:`prepare` (before decoding), :meth:`to_uint8` (per image, any thread) and
    :meth:`normalize` (once per batch) instead.
    """

    resize: int | tuple[int, int] | None = 256
    crop: tuple[int, int] | None = (224, 224)
    mean: tuple[float, ...] | None = IMAGENET_MEAN
    std: tuple[float, ...] | None = IMAGENET_STD
    draft: bool = False

    # ------------------------------------------------------------------ geometry
    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` after the resize, by torchvision's rule."""
        if self.resize is None:
            return width, height
        if isinstance(self.resize, int):
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.resize, int(self.resize * long / short)
            return (new_short, new_long) if width <= height else (new_long, new_short)
        return self.resize[1], self.resize[0]

    @property
    def output_shape(self) -> tuple[int, int, int] | None:
        """``(3, h, w)`` of every output when the crop or the resize fixes it, else None."""
        if self.crop is not None:
            return (3, *self.crop)
        if self.resize is not None and not isinstance(self.resize, int):
            return (3, *self.resize)
        return None

    # ------------------------------------------------------------------ per image
    def prepare(self, image: Any) -> tuple[int, int]:
        """Before decoding: ask for reduced-size JPEG decoding if :attr:`draft`; gives the
        image's full size, which :meth:`to_uint8` needs once the draft has shrunk it."""
        size = image.size
        if self.draft and self.resize is not None and getattr(image, "format", None) == "JPEG":
            image.draft("RGB", self.resized_size(*size))
        return size

    def to_uint8(self, image: Any, full_size: tuple[int, int] | None = None) -> torch.Tensor:
        """The resized, cropped RGB image as a ``uint8 [3, h, w]`` tensor (any strides).

        Args:
            image: a decoded RGB PIL image.
            full_size: its size before a draft (see :meth:`prepare`); None: ``image.size``.
        """
        from PIL import Image

        width, height = full_size or image.size
        rw, rh = self.resized_size(width, height)
        crop_h, crop_w = self.crop if self.crop is not None else (rh, rw)
        x0, xn, x_at = _axis(rw, crop_w)
        y0, yn, y_at = _axis(rh, crop_h)
        region = (x0, y0, x0 + xn, y0 + yn)
        iw, ih = image.size
        if (rw, rh) == (iw, ih):  # torchvision skips a resize to the same size
            pixels = _chw(image.crop(region))
        elif (rw >= iw and rh >= ih) or iw * ih > _TORCH_RESIZE_MAX_PIXELS:
            # An upscale (a small image: PIL is cheap, and exactly TorchServe's), or an image so
            # large that a uint8 copy of it for torch would cost more memory than PIL's resize.
            pixels = _chw(image.resize((rw, rh), Image.Resampling.BILINEAR).crop(region))
        else:
            full = torch.nn.functional.interpolate(
                _chw(image)[None], size=(rh, rw), mode="bilinear", align_corners=False, antialias=True
            )
            pixels = full[0, :, y0 : y0 + yn, x0 : x0 + xn]
        if (x_at, y_at, xn, yn) == (0, 0, crop_w, crop_h):
            return pixels
        padded = torch.zeros((3, crop_h, crop_w), dtype=torch.uint8)
        padded[:, y_at : y_at + yn, x_at : x_at + xn] = pixels
        return padded

    # ------------------------------------------------------------------ per batch
    def normalize(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """``uint8 [3, h, w]`` tensors (one size) → ``float32 [n, 3, h, w]``, TorchServe's arithmetic.

        In numpy, on purpose: the same IEEE float32 operations as torch's (bitwise equal), but
        no intra-op thread pool to wake, which on a busy machine costs more than the arithmetic.
        """
        import numpy as np

        out = np.stack([pixels.numpy() for pixels in images]).astype(np.float32)
        out /= np.float32(255)
        if self.mean is not None and self.std is not None:
            out -= np.asarray(self.mean, dtype=np.float32).reshape(1, -1, 1, 1)
            out /= np.asarray(self.std, dtype=np.float32).reshape(1, -1, 1, 1)
        return torch.from_numpy(out)

    def __call__(self, image: Any) -> torch.Tensor:
        """One PIL image → ``float32 [3, h, w]``, as the torchvision pipeline gives it."""
        from handlerkit.handlers._decode import convert_mode

        return self.normalize([self.to_uint8(convert_mode(image, "RGB"))])[0]

    def with_draft(self, draft: bool) -> ResizeCropNormalize:
        """A copy with reduced-size JPEG decoding on or off."""
        return self if draft == self.draft else replace(self, draft=draft)

    def to_torchvision(self) -> Any:
        """The equivalent torchvision ``Compose`` (TorchServe's way of writing it)."""
        from torchvision import transforms

        steps: list[Any] = []
        if self.resize is not None:
            steps.append(transforms.Resize(self.resize if isinstance(self.resize, int) else list(self.resize)))
        if self.crop is not None:
            steps.append(transforms.CenterCrop(list(self.crop)))
        steps.append(transforms.ToTensor())
        if self.mean is not None and self.std is not None:
            steps.append(transforms.Normalize(mean=list(self.mean), std=list(self.std)))
        return transforms.Compose(steps)


def _size(value: Any) -> tuple[int, int] | int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], int):
        return value[0]
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value[0], value[1])
    return None


def pipeline_from(transform: Any) -> ResizeCropNormalize | None:
    """The :class:`ResizeCropNormalize` that computes what ``transform`` computes, or None.

    Recognised: a :class:`ResizeCropNormalize`, or a torchvision (v1) ``Compose`` of
    ``[Resize]``, ``[CenterCrop]``, ``ToTensor``, ``[Normalize]`` in that order, Resize bilinear
    without ``max_size``. Anything else (subclasses, other steps) runs as written, image by image.
    """
    if isinstance(transform, ResizeCropNormalize):
        return transform
    module = type(transform).__module__ or ""
    if type(transform).__name__ != "Compose" or not module.startswith("torchvision.transforms"):
        return None
    from torchvision import transforms as T

    steps = list(getattr(transform, "transforms", []))
    resize: Any = None
    crop: Any = None
    if steps and type(steps[0]) is T.Resize:
        step = steps.pop(0)
        resize = _size(step.size)
        if resize is None or step.max_size is not None or step.interpolation != T.InterpolationMode.BILINEAR:
            return None
    if steps and type(steps[0]) is T.CenterCrop:
        size = _size(list(steps.pop(0).size))
        if size is None:
            return None
        crop = (size, size) if isinstance(size, int) else size
    if not steps or type(steps.pop(0)) is not T.ToTensor:
        return None
    mean = std = None
    if steps and type(steps[0]) is T.Normalize:
        step = steps.pop(0)
        mean, std = _channels(step.mean), _channels(step.std)
        if mean is None or std is None or 0 in std:
            return None
    if steps:
        return None
    return ResizeCropNormalize(resize=resize, crop=crop, mean=mean, std=std)


def _channels(values: Any) -> tuple[float, ...] | None:
    """Three per-channel values (one is broadcast, as Normalize does), else None."""
    try:
        floats = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    if len(floats) == 1:
        floats = floats * 3
    return floats if len(floats) == 3 else None
