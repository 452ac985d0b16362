"""TorchServe's image preprocessing (Resize → CenterCrop → ToTensor → Normalize), batched and exact.

TorchServe's ImageClassifier and ImageSegmenter run ``transforms.Compose([Resize(256),
CenterCrop(224), ToTensor(), Normalize(mean, std)])`` on each PIL image. :class:`ResizeCropNormalize`
gives the same tensor, bit for bit, with less work:

* the resize is PIL's, called as torchvision's ``Resize`` calls it (``image.resize(size,
  BILINEAR)``), so its pixels are TorchServe's whatever Pillow is installed (Pillow 13 resizes
  shapes whose height shrinks most vertically first, which changes the rounding of many
  pixels); where it is exact, PIL resamples only the crop's rows or columns
  (:func:`resize_crop`); an image already at the target size is not resized, as in torchvision;
* the crop is a view of the resized image, zero-padded where the crop is larger;
* each image is scaled and normalised with TorchServe's own arithmetic (``/255``, ``-mean``,
  ``/std`` in float32, so equal pixels give equal floats) into its row of the batch, in the
  decode thread that resized it: no float copy per image and no ``torch.stack``.

The work that makes TorchServe's pixels is PIL's decoding and resampling (on a 1280x960 JPEG,
about 4 ms each per image on one core); it cannot be skipped without changing pixels, so the
batched path gains by running it in parallel and by what it leaves out around it.

Opt-in, faster, not TorchServe's pixels:

* ``fast_resize=True``: a downscale by torch's uint8 antialiased kernel (``F.interpolate(...,
  antialias=True)`` on a channels-last uint8 tensor): PIL's algorithm with 16-bit instead of
  22-bit weights and always the horizontal pass first, so 0.05 to 1 % of a photo's pixels
  come out ±1 (a quarter of them for the shapes Pillow 13 resizes vertically first). On a
  1280x960 photo it takes 1.8 ms per image on one core (the uint8 copy included) where PIL
  takes 5.3 ms (decoding the JPEG: 4.5 ms);
* ``draft=True``: a JPEG is decoded at 1/2, 1/4 or 1/8 scale when the resize target allows
  (libjpeg's DCT scaling, PIL's ``Image.draft``).

:func:`pipeline_from` recognises the torchvision ``Compose`` handlers are written with, so a
TorchServe handler's own ``image_processing`` gets the batched path too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ResizeCropNormalize", "pipeline_from"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# With fast_resize, an image above this many pixels is still resized by PIL: torch's kernel needs
# a uint8 copy of it, which would cost more memory than PIL's resize.
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


def resize_crop(image: Any, size: tuple[int, int], region: tuple[int, int, int, int]) -> Any:
    """``image.resize(size, BILINEAR).crop(region)``, bit for bit, resampling less where it can.

    Given a source ``box``, PIL resamples the crop alone; its pixels are those of the whole
    resize when PIL then computes the same filter coefficients (:func:`_box_axis`) and runs its
    two passes in the same order (:func:`_vertical_first`). That holds on the short side of
    TorchServe's ``Resize(256)``, whose scale ``short/256`` is a short binary fraction, and saves
    an eighth of the resampling; elsewhere the whole image is resized, then cropped.
    """
    from PIL import Image

    (iw, ih), (x0, y0, x1, y1) = image.size, region
    axes = [_box_axis(iw, size[0], x0, x1 - x0), _box_axis(ih, size[1], y0, y1 - y0)]
    out = (x1 - x0 if axes[0] else size[0], y1 - y0 if axes[1] else size[1])
    if not any(axes) or _vertical_first(image.size, out) != _vertical_first(image.size, size):
        return image.resize(size, Image.Resampling.BILINEAR).crop(region)
    (bx0, bx1), (by0, by1) = (axis or (0.0, float(n)) for axis, n in zip(axes, image.size, strict=True))
    resized = image.resize(out, Image.Resampling.BILINEAR, box=(bx0, by0, bx1, by1))
    cx, cy = (0 if axes[0] else x0), (0 if axes[1] else y0)
    return resized.crop((cx, cy, cx + x1 - x0, cy + y1 - y0))


def _box_axis(length: int, resized: int, start: int, count: int) -> tuple[float, float] | None:
    """The source interval whose resampling to ``count`` pixels gives pixels ``start ..
    start + count`` of ``length`` resampled to ``resized``, with PIL's very coefficients; None
    when there is none, or nothing to gain.

    PIL computes in doubles from a float32 box: ``scale = (box1 - box0) / count``, a pixel's
    centre ``box0 + (i + 0.5) * scale``. With the whole axis that is ``length / resized`` and
    ``(start + i + 0.5) * scale``. When ``scale``'s numerator over its power-of-two denominator
    is small enough that every one of these values is exact (no rounding anywhere, in float32
    for the box, in doubles after), both give the same numbers.
    """
    if count == resized or length == resized:
        return None
    scale = Fraction(length / resized)
    if (start + count) * scale.numerator >= 2**24:  # the box must be exact in float32
        return None
    return float(start * scale), float((start + count) * scale)


def _vertical_first(source: tuple[int, int], out: tuple[int, int]) -> bool:
    """Whether PIL (13 on) resamples vertically first: when the height shrinks by more than
    twice as many pixels as the width (earlier versions always go horizontally first)."""
    shrink_w, shrink_h = source[0] - out[0], source[1] - out[1]
    return shrink_h > 0 and shrink_h > 2 * shrink_w


@dataclass(frozen=True)
class ResizeCropNormalize:
    """A PIL image → TorchServe's normalised ``float32 [3, H, W]`` tensor, batchable.

    Attributes:
        resize: torchvision ``Resize``'s size: an int resizes the shorter side to it (the
            longer one in proportion, truncated), ``(h, w)`` resizes to exactly that; None: no resize.
        crop: ``(h, w)`` of the centre crop (zero-padded when larger than the image); None: no crop.
        mean, std: per-channel normalisation after scaling to [0, 1]; None: no normalisation.
        draft: decode JPEGs at reduced size when the resize allows (changes pixels; off by default).
        fast_resize: downscale with torch's uint8 kernel instead of PIL's (faster, ±1 on a few
            pixels; off by default).

    Calling it on one image gives what the torchvision pipeline gives (bit for bit unless
    ``draft`` or ``fast_resize``); a handler calls
    :meth:`prepare` (before decoding), :meth:`to_uint8` (per image, any thread) and
    :meth:`normalize` (once per batch) instead.
    """

    resize: int | tuple[int, int] | None = 256
    crop: tuple[int, int] | None = (224, 224)
    mean: tuple[float, ...] | None = IMAGENET_MEAN
    std: tuple[float, ...] | None = IMAGENET_STD
    draft: bool = False
    fast_resize: bool = False

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
        width, height = full_size or image.size
        rw, rh = self.resized_size(width, height)
        crop_h, crop_w = self.crop if self.crop is not None else (rh, rw)
        x0, xn, x_at = _axis(rw, crop_w)
        y0, yn, y_at = _axis(rh, crop_h)
        region = (x0, y0, x0 + xn, y0 + yn)
        iw, ih = image.size
        if (rw, rh) == (iw, ih):  # torchvision skips a resize to the same size
            pixels = _chw(image.crop(region))
        elif self.fast_resize and not (rw >= iw and rh >= ih) and iw * ih <= _TORCH_RESIZE_MAX_PIXELS:
            full = torch.nn.functional.interpolate(
                _chw(image)[None], size=(rh, rw), mode="bilinear", align_corners=False, antialias=True
            )
            pixels = full[0, :, y0 : y0 + yn, x0 : x0 + xn]
        else:  # torchvision's Resize on a PIL image, then the crop: TorchServe's pixels
            pixels = _chw(resize_crop(image, (rw, rh), region))
        if (x_at, y_at, xn, yn) == (0, 0, crop_w, crop_h):
            return pixels
        padded = torch.zeros((3, crop_h, crop_w), dtype=torch.uint8)
        padded[:, y_at : y_at + yn, x_at : x_at + xn] = pixels
        return padded

    # ------------------------------------------------------------------ per batch
    def normalize(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """``uint8 [3, h, w]`` tensors (one size) → ``float32 [n, 3, h, w]``, TorchServe's arithmetic."""
        import numpy as np

        out = np.empty((len(images), *images[0].shape), dtype=np.float32)
        for pixels, row in zip(images, out, strict=True):
            self.normalize_into(pixels, row)
        return torch.from_numpy(out)

    def normalize_into(self, pixels: torch.Tensor, out: Any) -> None:
        """One ``uint8 [3, h, w]`` image, scaled and normalised into ``out`` (a float32 numpy
        array of its shape: a row of the batch, so each decode thread fills its own).

        TorchServe's arithmetic (``/255``, ``-mean``, ``/std``, each rounded to float32), so
        equal pixels give equal floats. In numpy on purpose: its ufuncs release the GIL and use
        no thread pool, where torch would wake its intra-op threads for every image.
        """
        import numpy as np

        out[...] = pixels.numpy()
        out /= np.float32(255)
        if self.mean is not None and self.std is not None:
            out -= np.asarray(self.mean, dtype=np.float32).reshape(-1, 1, 1)
            out /= np.asarray(self.std, dtype=np.float32).reshape(-1, 1, 1)

    def __call__(self, image: Any) -> torch.Tensor:
        """One PIL image → ``float32 [3, h, w]``, as the torchvision pipeline gives it."""
        from handlerkit.handlers._decode import convert_mode

        return self.normalize([self.to_uint8(convert_mode(image, "RGB"))])[0]

    def with_options(self, *, draft: bool | None = None, fast_resize: bool | None = None) -> ResizeCropNormalize:
        """A copy with reduced-size JPEG decoding and torch's resize kernel on or off (None: as
        they are); itself when nothing changes."""
        draft = self.draft if draft is None else draft
        fast_resize = self.fast_resize if fast_resize is None else fast_resize
        if (draft, fast_resize) == (self.draft, self.fast_resize):
            return self
        return replace(self, draft=draft, fast_resize=fast_resize)

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
