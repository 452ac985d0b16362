"""Explanations: attributions (captum's Integrated Gradients, what a vision handler's
``explain_handle`` answers for a request with the header ``explain: True``) drawn as a
diverging heat map over the input image, with a colour bar.

An attribution is told by where it comes from, not by its values (they look like any signed
float tensor): the output of the ``explain`` stage (``h.run`` of an explained batch records
``explain_handle`` under that name), image-sized ``[N, C, H, W]`` or ``[C, H, W]``. Channels
are summed (captum's ``visualize_image_attr`` does so), the colour limits are symmetric around
0 (±the 99th percentile of |attribution|, so one spike does not wash the rest out; larger
values saturate), and the colour at 0 is the map's neutral one; each value's opacity grows
with its size, so where the model looked is coloured and the rest shows the input in grey.
"""

from __future__ import annotations

import torch

from handlerkit.viz.images import unit_images
from handlerkit.viz.overlays import image_at
from handlerkit.viz.panel import Context, Panel, first, shrink

__all__ = ["ATTRIBUTION_CMAP", "MAX_EXPLAINED", "attributions_panel", "is_attribution"]

ATTRIBUTION_CMAP = "RdBu_r"  # red: raises the explained class's score; blue: lowers it; white: 0
MAX_EXPLAINED = 4  # requests drawn, side by side
SIDE = 256  # the longest side of each drawn map
QUANTILE = 0.99
_SAMPLE = 1 << 20  # the most values the colour limit is computed from


def is_attribution(x: torch.Tensor, ctx: Context) -> bool:
    """A float ``[N, C, H, W]`` or ``[C, H, W]`` (C 1 or 3) out of the ``explain`` stage."""
    return (
        ctx.stage == "explain"
        and x.is_floating_point()
        and x.dim() in (3, 4)
        and x.shape[-3] in (1, 3)
        and min(x.shape[-2:]) >= 4
        and x.numel() > 0
    )


def attributions_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """Per request, its attributions summed over channels as a diverging heat map (limits
    symmetric around 0) over its input image in grey; None (decline) for other tensors."""
    if not is_attribution(x, ctx):
        return None
    x = x if x.dim() == 4 else x.unsqueeze(0)
    x, n_note = first(x, MAX_EXPLAINED, "requests")
    small, step = shrink(x, SIDE)
    summed = torch.nan_to_num(small.float().sum(1), nan=0.0, posinf=0.0, neginf=0.0)
    magnitude = summed.abs().flatten()
    if magnitude.numel() > _SAMPLE:
        magnitude = magnitude[:: magnitude.numel() // _SAMPLE + 1]
    limit = float(torch.quantile(magnitude, QUANTILE)) if magnitude.numel() else 0.0
    limit = limit or float(summed.abs().max()) or 1.0  # all zero: any symmetric range
    bases = [_grey(ctx, i, summed.shape[-2:]) for i in range(summed.shape[0])]
    data = {
        "values": list(summed.cpu().numpy()),
        "images": bases,
        "labels": [f"request {i}" for i in range(summed.shape[0])],
        "limit": limit,
        "cmap": ATTRIBUTION_CMAP,
    }
    notes = [
        n
        for n in (
            n_note,
            f"summed over {x.shape[1]} channels; colour limits ±{limit:.3g} (the {QUANTILE:.0%} quantile of "
            "|attribution|); red raises the explained class's score, blue lowers it",
            "over the input image in grey" if any(b is not None for b in bases) else "no input image known",
            f"every {step}th pixel" if step > 1 else "",
        )
        if n
    ]
    n = len(bases)
    return Panel("attributions", f"{title}: attributions", data, notes, size=(min(7.2, 1.2 + 2.2 * n), 3.4))


def _grey(ctx: Context, index: int, size: torch.Size) -> object:
    """Request `index`'s input image in grey ([H, W] numpy in [0, 1]) at `size`, or None."""
    image = image_at(ctx.image, index)
    if image is None:
        return None
    x01, _ = unit_images(image.unsqueeze(0), ctx.view)
    grey = x01.mean(1, keepdim=True)
    if tuple(grey.shape[-2:]) != tuple(size):
        grey = torch.nn.functional.interpolate(grey, size=tuple(size), mode="bilinear", align_corners=False)
    return grey[0, 0].clamp(0, 1).cpu().numpy()
