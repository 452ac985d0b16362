"""The synthetic "shapes" dataset: one PIL-drawn shape per image, with its mask and box.

Every sample carries a class label, a boolean mask of exactly the pixels the shape covers and
the mask's bounding box, so the same data can train a classifier, a segmenter and a detector
whose answers are checkable. Generation is deterministic: sample ``i`` of a dataset with seed
``s`` is drawn from its own ``numpy.random.default_rng([s, i])``, so it does not depend on how
many samples are drawn, and no global random state is touched.

Boxes follow ``torchvision.ops.masks_to_boxes``: ``(x0, y0, x1, y1)`` with *inclusive* pixel
coordinates, i.e. ``x1`` is the last column the mask covers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")
"""Class names in label-index order (index 0 is ``circle``)."""

BACKGROUNDS: tuple[str, ...] = ("plain", "gradient", "noise")

Box = tuple[int, int, int, int]

_MIN_EXTENT, _MAX_EXTENT = 0.35, 0.75  # shape diameter as a fraction of the image side
_MIN_LUMA_GAP = 60.0  # shape vs background luminance difference (0-255 scale)
_NOISE_SIGMA = 8.0


@dataclass(frozen=True)
class ShapeSample:
    """One drawn image with its ground truth."""

    image: Image.Image  # RGB, size x size
    label: int  # index into CLASSES
    mask: np.ndarray  # bool [size, size], True where the shape was drawn
    box: Box  # (x0, y0, x1, y1), inclusive, as torchvision.ops.masks_to_boxes

    @property
    def kind(self) -> str:
        return CLASSES[self.label]


def _luma(rgb: np.ndarray) -> np.ndarray:
    return rgb @ np.array([0.299, 0.587, 0.114])


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a shape whose circumscribed circle has centre (cx, cy) and radius r."""
    if kind == "square":
        radii, count = [r], 4
    elif kind == "triangle":
        radii, count = [r], 3
    elif kind == "star":
        radii, count = [r, 0.42 * r], 10
    elif kind == "cross":
        # A plus sign: arms of half-width w reach the circumscribed circle.
        w = 0.3 * r
        reach = math.sqrt(r * r - w * w)
        local = [(w, -w), (reach, -w), (reach, w), (w, w), (w, reach), (-w, reach),
                 (-w, w), (-reach, w), (-reach, -w), (-w, -w), (-w, -reach), (w, -reach)]
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in local]
    else:
        raise ValueError(f"no polygon for shape {kind!r}; expected one of {CLASSES[1:]}")
    step = 2 * math.pi / count
    return [
        (cx + radii[k % len(radii)] * math.cos(angle + k * step),
         cy + radii[k % len(radii)] * math.sin(angle + k * step))
        for k in range(count)
    ]


def _background(rng: np.random.Generator, size: int, style: str) -> tuple[np.ndarray, np.ndarray]:
    """Return (pixels as float [size, size, 3], the colours it is made of as [k, 3])."""
    first = rng.uniform(0, 255, 3)
    if style == "plain":
        return np.broadcast_to(first, (size, size, 3)).copy(), first[None]
    if style == "gradient":
        second = np.clip(first + rng.uniform(-80, 80, 3), 0, 255)
        theta = rng.uniform(0, 2 * math.pi)
        ys, xs = np.mgrid[0:size, 0:size] / (size - 1)
        t = (xs * math.cos(theta) + ys * math.sin(theta))
        t = (t - t.min()) / (t.max() - t.min())
        pixels = first + t[..., None] * (second - first)
        return pixels, np.stack([first, second])
    if style == "noise":
        pixels = first + rng.normal(0, _NOISE_SIGMA, (size, size, 3))
        return pixels, first[None]
    raise ValueError(f"unknown background {style!r}; expected one of {BACKGROUNDS}")


def _contrasting_colour(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A colour whose luminance is at least _MIN_LUMA_GAP away from every background colour."""
    lumas = _luma(background)
    low, high = lumas.min() - _MIN_LUMA_GAP, lumas.max() + _MIN_LUMA_GAP
    for _ in range(1000):
        colour = rng.uniform(0, 255, 3)
        if not low < _luma(colour) < high:
            return colour
    # Unreachable in practice (a luma gap of 60 always leaves room); stay deterministic anyway.
    return np.zeros(3) if high < 255 else np.full(3, 255.0)


def make_shape_image(
    kind: str,
    rng: np.random.Generator,
    size: int = 256,
    *,
    background: str | None = None,
) -> tuple[Image.Image, np.ndarray, Box]:
    """Draw one ``kind`` shape on a random background.

    Args:
        kind: one of ``CLASSES``.
        rng: the only source of randomness used.
        size: the image side in pixels.
        background: ``"plain"``, ``"gradient"`` or ``"noise"``; random when None.

    Returns:
        ``(image, mask, box)``: an RGB ``size`` x ``size`` image, a bool mask of the shape's
        pixels and its inclusive ``(x0, y0, x1, y1)`` box.
    """
    if kind not in CLASSES:
        raise ValueError(f"unknown shape {kind!r}; expected one of {CLASSES}")
    if background is None:
        background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    pixels, bg_colours = _background(rng, size, background)
    colour = _contrasting_colour(rng, bg_colours)

    r = rng.uniform(_MIN_EXTENT, _MAX_EXTENT) * size / 2
    cx, cy = rng.uniform(r, size - 1 - r, 2)
    angle = rng.uniform(0, 2 * math.pi)

    mask_image = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask_image)
    if kind == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=255)
    else:
        draw.polygon(_polygon(kind, cx, cy, r, angle), fill=255)
    mask = np.asarray(mask_image) > 0

    # Painting through the mask makes the mask exactly the set of shape pixels.
    pixels = np.where(mask[..., None], colour, pixels)
    image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB")
    return image, mask, mask_box(mask)


def mask_box(mask: np.ndarray) -> Box:
    """The inclusive ``(x0, y0, x1, y1)`` box of a non-empty bool mask."""
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        raise ValueError("mask_box needs a non-empty mask")
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())


def iter_shapes(n: int, seed: int, size: int = 256) -> Iterator[ShapeSample]:
    """Yield ``n`` samples; labels cycle through CLASSES so every class is equally frequent."""
    for i in range(n):
        label = i % len(CLASSES)
        rng = np.random.default_rng([seed, i])
        image, mask, box = make_shape_image(CLASSES[label], rng, size)
        yield ShapeSample(image, label, mask, box)


def make_shapes_dataset(n: int, seed: int, size: int = 256) -> list[ShapeSample]:
    """``n`` samples as a list (for a few hundred images; use ``iter_shapes`` for more)."""
    return list(iter_shapes(n, seed, size))
