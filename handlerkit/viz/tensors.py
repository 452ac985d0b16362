"""The built-in pictures of a tensor, in the order ``hk.show`` tries them: ``TENSORS``.

``tensor_panel`` makes a tensor drawable (a card when it has no values to draw; dense; 5-d and
more: its first 4-d slice; int16 PCM samples as floats; complex as ``|x|``; quantized
dequantized) and hands it to the first picture of ``TENSORS`` that draws it. Each picture is
``(x, ctx, title) -> Panel | None`` (None declines); the last draws every 1-d tensor. To add a
picture, add it before the first it must precede: ``TENSORS.add(spectrogram_panel,
before="image_grid")``, and give it a row below. Token ids are int32/int64.

``TENSORS``, ``(x, ctx, title) -> Panel | None`` for 1 to 4 real dims. *Image-sized*: the last
two dims both at least 4 and neither more than 32 times the other. A *model output* is the
value of any stage but preprocess (the model's input is never labelled with its classes); a
value given alone may be one, labelled only from the ``handler=`` its caller chose.

=============================  ===================================================================
``attributions``               an explain stage's ``[N, C, H, W]`` floats: a diverging heat map
                               (symmetric around 0) over the input image in grey, a colour bar
``pixel_classes``              a segmenter's ``[N, H, W, 2]`` answer (whole class, probability):
                               its class mask over the input image
``maps``                       ``[N, 1, H, W]`` or ``[1, H, W]`` floats that are not pixels
                               (``maps``' rule): a heat map per request, one colour bar;
                               time × frequency, low frequencies at the bottom, for a
                               non-square preprocess output
``class_scores_per_position``  ``[N, L, K]`` floats, a model output with K the mapping's width (a
                               tagger's): a heat map, a row per ``[n, l]``, a column per class
``rows_of_leading_dims``       3-d and 4-d, not image-sized: a row per leading index (``[N, 1,
                               T]`` audio: ``[N, T]``), then as 2-d
``bool_masks``                 booleans: ``[N, H, W]``, ``[N, K, H, W]`` masks over the input
                               image; ``[N, L]`` a grid of the values; ``[N]`` two bars of counts
``uint8_images``               ``[N, 1|3, H, W]`` or ``[1|3, H, W]`` uint8: an image grid
``grey_uint8``                 ``[H, W]`` uint8 without a vocabulary: a heat map (a grey image)
``class_maps``                 ``[N, H, W]`` (or ``[N, 1, H, W]``) integers: a segmentation mask
                               over the input image
``zero_one``                   ``[N, L]`` integers of 0 and 1 (an attention mask): a heat map
``token_ids``                  ``[N, L]`` integers (with a vocabulary, or ≤ 64 × 4096), ``[L]``
                               with a vocabulary: a table of vocabulary entries (ids without one)
``integer_histogram``          other integers but ``[K]``, K ≤ 32: a histogram
``segmentation_scores``        ``[N, C, H, W]`` floats, C the mapping's width or H, W the input
                               image's: a segmentation (argmax per pixel over the input image)
``image_grid``                 ``[N, 1|3, H, W]`` or ``[1|3, H, W]`` floats: an image grid,
                               de-normalised
``feature_maps``               other ``[N, C, H, W]``: sample 0's channels as feature maps;
                               ``[C, H, W]`` likewise
``class_bars``                 ``[N, K]`` or ``[K]`` floats, a model output with K the mapping's
                               width: top-k bars per row labelled from the mapping
``signals``                    ``[N, T]`` floats, N ≤ 8, T ≥ 64: a line per row
``heatmap``                    other 2-d: a heat map, each value written in when it is at most
                               24 × 12 (a feature table)
``values``                     ``[K]``, K ≤ 32 (floats or integers): one bar per value
``signal``                     other 1-d: a line
=============================  ===================================================================
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from handlerkit.summaries import no_values, tensor_head
from handlerkit.viz.bars import bars_panel, values_panel
from handlerkit.viz.cards import summary_card
from handlerkit.viz.explanations import attributions_panel
from handlerkit.viz.histogram import histogram_panel
from handlerkit.viz.images import features_panel, heatmap_panel, images_panel
from handlerkit.viz.lines import MAX_LINES, lines_panel
from handlerkit.viz.maps import maps_panel
from handlerkit.viz.overlays import pixel_classes_panel, segmentation_panel
from handlerkit.viz.panel import Context, Panel
from handlerkit.viz.registry import Chain
from handlerkit.viz.tokens import tokens_panel

__all__ = ["MAX_VALUES", "SIGNAL", "TENSORS", "image_sized", "spatial", "tensor_panel"]

SIGNAL = 64  # the shortest row drawn as a line
MAX_VALUES = 32  # the longest 1-d tensor drawn as one bar per value

#: The built-in pictures of a tensor of 1 to 4 real dims, ``(x, ctx, title) -> Panel | None``.
TENSORS = Chain("show's pictures of tensors")


def tensor_panel(x: torch.Tensor, ctx: Context, label: str) -> Panel:
    """The panel for one tensor: a card when it holds no values to draw, else `x` made a
    strided real tensor of at most 4 dims and handed to the first of ``TENSORS`` that draws it."""
    title = f"{label}: {tensor_head(x)}" if label else tensor_head(x)
    # The card's statistics are computed only for a card: a picture must not reduce a huge tensor.
    if x.is_nested:
        return summary_card(title, x, "a nested tensor has no single shape to draw")
    if no_values(x):
        return summary_card(title, x, "its values do not exist yet (a meta or fake tensor)")
    if x.layout != torch.strided:
        if x.numel() > 2**24:
            return summary_card(title, x, "a sparse tensor this large is not made dense to be drawn")
        x = x.to_dense()
    if x.numel() == 0:
        return summary_card(title, x, "the tensor is empty")
    if x.dim() == 0:
        return summary_card(title, x, "a single value has nothing to plot (it is above)")
    with torch.no_grad():
        x = x.detach()
        notes = []
        if x.is_quantized:
            x = x.dequantize()
        if x.is_complex():
            x = x.abs()
            notes.append("|x| of a complex tensor")
        if x.dtype == torch.int16:  # PCM audio samples, not token ids
            x = x.float()
            notes.append("int16 samples")
        x, lead = _leading(x, 4)
        panel = _pick(x, ctx, title)
    panel.notes = [n for n in [lead, *notes] if n] + panel.notes
    return panel


def _pick(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """The first answer of ``TENSORS`` for a tensor of 1 to 4 dims (the last always answers)."""
    panel = TENSORS.first(x, ctx, title)
    if panel is None:  # pragma: no cover - the chain's last picture draws every 1-d tensor
        return summary_card(title, x, "no picture in the chain drew it")
    return panel


def _width(ctx: Context) -> int | None:
    return len(ctx.view.mapping) if ctx.view.mapping else None


def _class_scores_per_position(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    width = _width(ctx)
    if x.dim() == 3 and x.is_floating_point() and width and width >= 2 and x.shape[-1] == width and ctx.model_output:
        return _scores_per_position(x, ctx, title)
    return None


def _rows_of_leading_dims(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    return _rows(x, ctx, title) if x.dim() >= 3 and not image_sized(x.shape[-2], x.shape[-1]) else None


def _bool_masks(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """Booleans: masks over the input image (3-d, 4-d), a grid of the values (2-d: an attention
    or padding mask, a row per request), two bars of counts (1-d)."""
    if x.dtype != torch.bool:
        return None
    dims = x.dim()
    if dims == 3 or (dims == 4 and x.shape[1] == 1):
        return segmentation_panel(x.reshape(-1, *x.shape[-2:]), ctx, f"{title}: masks")
    if dims == 4:
        return segmentation_panel(x, ctx, f"{title}: masks")
    if dims == 2:
        return heatmap_panel(x.to(torch.uint8), f"{title}: mask (1 = True)")
    return histogram_panel(x, title)


def _uint8_images(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    if x.dtype == torch.uint8 and x.dim() in (3, 4) and x.shape[-3] in (1, 3):
        return images_panel(x if x.dim() == 4 else x.unsqueeze(0), ctx, title)
    return None


def _grey_uint8(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    if x.dtype == torch.uint8 and x.dim() == 2 and ctx.view.lookup is None:  # a grey image, not token ids
        return heatmap_panel(x, title)
    return None


def _class_maps(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """Integers ``[N, H, W]`` (or ``[N, 1, H, W]``): a class per pixel."""
    if not x.is_floating_point() and (x.dim() == 3 or (x.dim() == 4 and x.shape[1] == 1)):
        return segmentation_panel(x.reshape(-1, *x.shape[-2:]), ctx, f"{title}: segmentation")
    return None


def _zero_one(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    if x.is_floating_point() or x.dim() != 2:
        return None
    head = x[:64, :4096]
    return heatmap_panel(x, f"{title}: 0/1") if bool(((head == 0) | (head == 1)).all()) else None  # an attention mask


def _token_ids(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    if x.is_floating_point():
        return None
    if x.dim() == 2 and (ctx.view.lookup is not None or (x.shape[0] <= 64 and x.shape[1] <= 4096)):
        return tokens_panel(x, ctx, f"{title}: tokens")
    if x.dim() == 1 and ctx.view.lookup is not None:
        return tokens_panel(x.unsqueeze(0), ctx, f"{title}: tokens")
    return None


def _integer_histogram(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """Integers: a histogram; ``[K]``, K ≤ 32 (a user id per request) declined: its values."""
    if x.is_floating_point() or (x.dim() == 1 and x.shape[0] <= MAX_VALUES):
        return None
    return histogram_panel(x, title)


def _segmentation_scores(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """``[N, K, H, W]`` scores, K the mapping's width or H, W the input image's: argmax per pixel."""
    if x.dim() != 4:
        return None
    channels, width = x.shape[1], _width(ctx)
    same_size = ctx.image is not None and spatial(ctx.image) == tuple(x.shape[-2:])
    if channels >= 2 and (
        (width == channels and (ctx.image is not None or channels not in (1, 3)))
        or (channels not in (1, 3) and same_size)
    ):
        return segmentation_panel(x, ctx, f"{title}: segmentation (argmax)")
    return None


def _image_grid(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    if x.dim() == 4 and x.shape[1] in (1, 3):
        return images_panel(x, ctx, title)
    if x.dim() == 3 and x.shape[0] in (1, 3):
        return images_panel(x.unsqueeze(0), ctx, title)
    return None


def _feature_maps(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    if x.dim() == 3:
        return features_panel(x, ctx, f"{title}: channels")
    if x.dim() != 4:
        return None
    panel = features_panel(x[0], ctx, f"{title}: feature maps")
    if x.shape[0] > 1:
        panel.notes.insert(0, f"sample 0 of {x.shape[0]}")
    return panel


def _class_bars(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """A model's scores over the mapping's classes, ``[N, K]`` or ``[K]``: top-k bars."""
    k, width = x.shape[-1], _width(ctx)
    if x.dim() <= 2 and k >= 2 and k == width and ctx.model_output:
        return bars_panel(x if x.dim() == 2 else x.unsqueeze(0), ctx, f"{title}: top {min(ctx.top_k, k)}")
    return None


def _signals(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    if x.dim() == 2 and x.shape[0] <= MAX_LINES and x.shape[1] >= SIGNAL:
        return lines_panel(x, f"{title}: signals" if x.shape[0] > 1 else f"{title}: signal")
    return None


def _heatmap(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    return heatmap_panel(x, title) if x.dim() == 2 else None


def _values(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    return values_panel(x, f"{title}: values") if x.dim() == 1 and x.shape[0] <= MAX_VALUES else None


def _signal(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    return lines_panel(x.reshape(1, -1), f"{title}: signal")


for _tensor_draw in (
    _class_scores_per_position,
    _rows_of_leading_dims,
    _bool_masks,
    _uint8_images,
    _grey_uint8,
    _class_maps,
    _zero_one,
    _token_ids,
    _integer_histogram,
    _segmentation_scores,
    _image_grid,
    _feature_maps,
    _class_bars,
    _signals,
    _heatmap,
    _values,
    _signal,
):
    TENSORS.add(_tensor_draw, name=_tensor_draw.__name__.lstrip("_"))
# Narrower than every rule above, so tried first: an explain stage's attributions, a segmenter's
# [N, H, W, 2] (class, probability) answer, a float map that is not pixels (maps' docstring).
for _narrow in (attributions_panel, pixel_classes_panel, maps_panel):
    TENSORS.add(_narrow, name=_narrow.__name__.removesuffix("_panel"), before="class_scores_per_position")


def _scores_per_position(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """``[N, L, K]`` model output, K the mapping's width (a tagger's class scores for each of L
    tokens): a heat map, a row per ``[sample, position]``, a column per class named from the
    mapping, whatever L is (an image-sized ``[N, L, K]`` is no image here)."""
    lead = list(x.shape[:-1])
    columns = [ctx.view.label(i) for i in range(x.shape[-1])]
    where = f"row (index of the leading dims {lead})"
    panel = heatmap_panel(
        x.reshape(-1, x.shape[-1]), f"{title}: class scores per position", row=where, columns=columns, column="class"
    )
    panel.notes[:0] = [f"a row per index of the leading dims {lead}", f"labels from {ctx.view.mapping_at}"]
    return panel


def _rows(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """A 3-d or 4-d tensor that is no image ([N, 1, T] audio, [N, C, 1, T]): a row per leading
    index, drawn as a 2-d tensor is (lines or a heat map), each row named by its index."""
    lead = tuple(x.shape[:-1])
    flat = x.reshape(-1, x.shape[-1])
    named = f"a row per index of the leading dims {list(lead)}"
    if flat.is_floating_point() and flat.shape[0] <= MAX_LINES and flat.shape[1] >= SIGNAL:
        labels = [str(list(i)) for i in itertools.product(*(range(d) for d in lead))]
        panel = lines_panel(flat, f"{title}: signals" if flat.shape[0] > 1 else f"{title}: signal", labels)
    elif flat.is_floating_point():
        panel = heatmap_panel(flat, title, row=f"row (index of the leading dims {list(lead)})")
    else:
        panel = _pick(flat, ctx, title)
    panel.notes.insert(0, named)
    return panel


def image_sized(height: int, width: int) -> bool:
    """Two dims that can be an image's: both at least 4, neither 32 times the other."""
    return min(height, width) >= 4 and max(height, width) <= 32 * min(height, width)


def spatial(images: Any) -> tuple[int, int] | None:
    first = images[0] if isinstance(images, (list, tuple)) else images
    return tuple(first.shape[-2:]) if hasattr(first, "shape") else None


def _leading(x: torch.Tensor, ndim: int) -> tuple[torch.Tensor, str]:
    """Index 0 along the leading dims until `x` has `ndim` dims (a 5-d video → its first clip)."""
    if x.dim() <= ndim:
        return x, ""
    extra = x.dim() - ndim
    return x[(0,) * extra], f"index [{', '.join(['0'] * extra)}] of a {x.dim()}-d tensor"
