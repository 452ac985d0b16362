"""A panel: one picture's bounded data, what it may use besides the value, and the bounds.

Every panel module (``images``, ``bars``, ``histogram``, ``overlays``, ``tokens``, ``cards``, ``chunks``)
returns a :class:`Panel` that ``draw`` turns into axes. Panels work where the tensor lives and
subsample first (at most ``max_images`` images or channels, grids at most ``MAX_SIDE`` pixels a
side, with the helpers below), then copy only that bounded result to the host, so a huge
tensor draws as fast as a small one. Nothing here imports matplotlib.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from handlerkit.viz.handler_view import HandlerView

__all__ = ["MAX_SIDE", "Context", "Panel", "cell_side", "columns", "finite_range", "first", "shrink"]

MAX_SIDE = 1024  # the longest side of a drawn grid, in pixels


@dataclass
class Context:
    """What a picture may use besides the value: the handler's facts, limits, the input image."""

    view: HandlerView
    top_k: int = 5
    max_images: int = 16
    image: Any = None  # the input image batch ([N, C, H, W] or a list of [C, H, W]) for overlays
    stage: str | None = None  # the stage that produced the value; None for a value given alone
    label: str = ""  # what the value is ("preprocess output['mask']"), for a user's picture
    depth: int = 0  # levels of lists and dicts above the value
    seen: dict[int, Any] | None = field(default=None, repr=False)  # the values a Run drew already, by id

    chain: Any = field(default=None, repr=False)  # value -> panels: the whole chain (set by dispatch)

    def draw(self, value: Any, label: str | None = None) -> list[Panel]:
        """The pictures ``hk.show`` gives `value` (a user's picture delegating: ``ctx.draw(self.ids)``)."""
        if self.chain is None:
            raise RuntimeError("Context.draw needs the chain of pictures: a context made by hk.show has it")
        return self.chain(value, self, self.label if label is None else label)

    @property
    def model_output(self) -> bool:
        """Whether the value may be a model's output (scores to rank): anything but the model's
        input. A value given alone may be: its labels come only from a ``handler=`` the caller chose."""
        return self.stage not in ("initialize", "preprocess")


@dataclass
class Panel:
    """One picture: a kind ``draw`` knows, its title, notes and bounded data."""

    kind: str  # card, images, features, heatmap, histogram, bars, lines, overlay, table, timeline, axes, html
    title: str
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    size: tuple[float, float] = (4.8, 4.0)  # inches


def columns(n: int) -> int:
    """The columns of a square-ish grid of `n` images."""
    return max(1, math.ceil(math.sqrt(n)))


def cell_side(n: int) -> int:
    """The longest side of each of `n` images in a grid of at most ``MAX_SIDE`` pixels
    (``make_grid`` pads each by 2)."""
    return max(1, (MAX_SIDE - 2) // columns(n) - 2)


def shrink(x: torch.Tensor, side: int) -> tuple[torch.Tensor, int]:
    """A strided view whose last two dims are at most `side` (no copy), and the stride."""
    step = max(1, math.ceil(max(x.shape[-2], x.shape[-1]) / max(side, 1)))
    return (x[..., ::step, ::step] if step > 1 else x), step


def first(x: torch.Tensor, n: int, what: str) -> tuple[torch.Tensor, str]:
    """The first `n` along dim 0, and a note when some were left out."""
    if x.shape[0] <= n:
        return x, ""
    return x[:n], f"first {n} of {x.shape[0]} {what}"


def finite_range(x: torch.Tensor) -> tuple[float, float] | None:
    """min and max of the finite values (one transfer), or None when there are none."""
    finite = torch.isfinite(x)
    inf = torch.full((), float("inf"), dtype=x.dtype, device=x.device)
    low, high, count = torch.stack(
        [torch.where(finite, x, inf).min(), torch.where(finite, x, -inf).max(), finite.sum().to(x.dtype)]
    ).tolist()
    return (low, high) if count else None
