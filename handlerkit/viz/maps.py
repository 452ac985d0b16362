"""Float maps that are not pixels (spectrograms, mel and log features, a one-channel saliency or
depth map): a heat map per request on one colour scale, the data's own, with a colour bar.

The rule that tells a map from an image (:func:`is_map`). A one-channel float tensor
``[N, 1, H, W]`` (or ``[1, H, W]``), both sides at least 4, is **pixels** when

- the handler normalises images (a torchvision ``Normalize`` found on it: its pixels are
  de-normalised on the image path), or
- its finite values lie in [0, 1] (``ToTensor``'s range; a little overshoot from resizing
  allowed), or
- they are whole numbers in [0, 255] (8-bit pixels as floats);

otherwise it is a **map**: a ``log1p|STFT|`` in [0, 3.5], a dB mel spectrogram in [-80, 0], a
standardised feature map. A map that is the model's input (a preprocess output, or a value
given alone) and not square is **time × frequency**: rows are frequency bins, drawn with the
lowest at the bottom, columns are time frames (``torch.stft``, torchaudio and librosa put
frequency before time). A square map (attention, distances) or a later stage's map (a depth
or saliency map the model made) keeps row 0 at the top, as a matrix or an image does.
``[N, H, W]`` is left to the other pictures: its rows may as well be tokens (``[N, L, D]``
embeddings, time first) as frequencies.
"""

from __future__ import annotations

from typing import Any

import torch

from handlerkit.viz.images import pixel_scale
from handlerkit.viz.panel import Context, Panel, finite_range, first, shrink

__all__ = ["MAP_SIDE", "MAX_MAPS", "is_map", "maps_panel"]

MAX_MAPS = 8  # requests drawn, one heat map each
MAP_SIDE = 512  # the longest side of each drawn map, in values


def _as_maps(x: torch.Tensor) -> torch.Tensor | None:
    """`x` as ``[N, H, W]`` one map per request when its shape is a one-channel map's, else None."""
    if not x.is_floating_point() or x.dim() not in (3, 4):
        return None
    maps = x[:, 0] if x.dim() == 4 and x.shape[1] == 1 else x if x.dim() == 3 and x.shape[0] == 1 else None
    if maps is None or maps.shape[0] == 0 or min(maps.shape[-2:]) < 4:
        return None
    return maps


def is_map(x: torch.Tensor, ctx: Context) -> bool:
    """Whether `x` is a one-channel float map that is not pixels (the rule in the module docstring)."""
    maps = _as_maps(x)
    return maps is not None and _bounds_of_map(maps, ctx) is not None


def _bounds_of_map(maps: torch.Tensor, ctx: Context) -> tuple[float, float] | None:
    """The finite min and max of `maps` when its values are no pixels' (the rule), else None."""
    if ctx.view.mean:
        return None
    bounds = finite_range(maps)
    if bounds is None or pixel_scale(torch.nan_to_num(maps), bounds) is not None:
        return None
    return bounds


def maps_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """A heat map per request (``request 0``, ``request 1``...) on one colour scale from the
    data's finite min to max, with a colour bar; None (decline) when `x` is no map."""
    maps = _as_maps(x)
    bounds = _bounds_of_map(maps, ctx) if maps is not None else None
    if maps is None or bounds is None:
        return None
    rows, cols = maps.shape[-2:]
    maps, n_note = first(maps, min(ctx.max_images, MAX_MAPS), "requests")
    small, step = shrink(maps, MAP_SIDE)
    values = torch.where(torch.isfinite(small), small.float(), torch.nan).cpu().numpy()
    time_frequency = ctx.stage in (None, "preprocess") and rows != cols
    data: dict[str, Any] = {
        "maps": list(values),
        "labels": [f"request {i}" for i in range(values.shape[0])],
        "shape": (rows, cols),
        "limits": bounds,
        "low_at_bottom": time_frequency,
        "xlabel": "time (frame)" if time_frequency else "column",
        "ylabel": "frequency (bin)" if time_frequency else "row",
        "cmap": "magma" if time_frequency else "viridis",
    }
    low, high = bounds
    notes = [n for n in (n_note, f"every {step}th value along each side" if step > 1 else "") if n]
    what = "time × frequency, low frequencies at the bottom" if time_frequency else "a map, not pixels"
    notes.insert(0, f"{what}; one colour scale {low:.3g} … {high:.3g} (the data's)")
    n = values.shape[0]
    per_row = min(n, 4)
    lines = -(-n // per_row)
    return Panel("maps", f"{title}: heat maps", data, notes, size=(min(7.2, 1.0 + 1.8 * per_row), 1.2 + 2.2 * lines))
