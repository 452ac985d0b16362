"""Which picture fits which data: the one place ``hk.show`` decides.

Everything below only recognises what came and hands it to a panel module (``images``,
``bars``, ``histogram``, ``overlays``, ``tokens``, ``cards``); the panels build the bounded
data, ``draw`` draws it. To change which picture a value gets, change this module alone.

How the picture is chosen, for a tensor (5-d and more: its first 4-d slice):

=====================================  =================================================
``[N, 1|3, H, W]`` floats or uint8     an image grid, de-normalised (``[1|3, H, W]`` too)
``[N, C, H, W]`` floats, other C       a segmentation (argmax per pixel over the input
                                       image) when C is the mapping's width or H, W the
                                       input image's; else sample 0's channels as
                                       feature maps (``[C, H, W]`` likewise)
``[N, H, W]`` integers or booleans     a segmentation mask over the input image
``[N, K]`` floats                      top-k bars per row labelled from the mapping
                                       (softmax of logits) for an inference output, K
                                       the mapping's width, or N ≤ 16, N ≤ K ≤ 1000;
                                       else a heat map
``[N, L]`` integers                    a table of vocabulary entries (ids without one)
1-d                                    scores or values as bars (≤ 32), else a histogram
empty, 0-d, meta or fake tensors       a summary card
=====================================  =================================================

and for structures: torchvision detections (``[{"boxes", "labels", "scores"}]``) or
TorchServe's detector output as boxes on the input image; ``{label: probability}`` dicts as
bars; a list of same-sized images as one batch; other lists and dicts one panel per item
(at most six). A Run shows one panel per stage; a failed stage shows its error and fix.
"""

from __future__ import annotations

from typing import Any

import torch

from handlerkit.errors import HandlerkitError
from handlerkit.results import Run, StageResult
from handlerkit.summaries import describe, no_values, summary, tensor_head, tensor_summary
from handlerkit.viz.bars import bars_panel, dict_bars_panel, values_panel
from handlerkit.viz.cards import card, error_card
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.histogram import histogram_panel
from handlerkit.viz.images import features_panel, heatmap_panel, images_panel
from handlerkit.viz.overlays import detections_panel, segmentation_panel
from handlerkit.viz.panel import Context, Panel
from handlerkit.viz.tokens import tokens_panel

__all__ = ["panels_for"]

MAX_ITEMS = 6  # panels for the items of a list or dict
_FIX = "pass a tensor, a StageResult (h.results['preprocess']), a Run (h.run(batch)) or a list/dict of tensors"


def panels_for(obj: Any, view: HandlerView, *, image: Any = None, top_k: int = 5, max_images: int = 16) -> list[Panel]:
    """The panels of `obj` (a StageResult, a Run, or a value), using what `view` knows of the
    handler; `image` overrides the input image the overlays are drawn on.

    Raises:
        HandlerkitError: a value that holds nothing to draw (it names what came).
    """

    def context(input_image: Any, scores: bool) -> Context:
        return Context(view, top_k, max_images, image if image is not None else input_image, scores)

    if isinstance(obj, StageResult):
        if obj.error is not None:
            return [error_card(obj)]
        label = f"{obj.stage} output"
        panels = _value_panels(obj.output, context(_image_like(obj.input), obj.stage == "inference"), label)
        return panels or [card(label, summary(obj.output).splitlines())]
    if isinstance(obj, Run):
        return _run_panels(obj, context)
    panels = _value_panels(obj, context(None, False), "")
    if not panels:
        got = describe(obj)
        holds = ", which holds no tensor" if isinstance(obj, (list, tuple, dict)) else ""
        raise HandlerkitError(
            f"show() draws tensors, StageResults, Runs and lists/dicts of them: got {got}{holds}", fix=_FIX
        )
    return panels


def _run_panels(run: Run, context: Any) -> list[Panel]:
    """One panel per stage (the first of each), the input image taken from preprocess."""
    pre = run.stages.get("preprocess")
    input_image = _image_like(pre.output) if pre is not None and pre.ok else None
    panels: list[Panel] = []
    for name, result in run.stages.items():
        if result.error is not None:
            panels.append(error_card(result))
        elif name != "initialize":
            drawn = _value_panels(result.output, context(input_image, name == "inference"), f"{name} output")[:1]
            if name == "postprocess" and drawn and drawn[0].kind == "bars" and any(p.kind == "bars" for p in panels):
                continue  # the classifier's probabilities again, as dicts
            panels += drawn
    if not panels:
        lines = [f"{name}: {describe(r.output)}" for name, r in run.stages.items()]
        panels = [card(f"Run of {run.batch_size} request(s): nothing to draw", lines)]
    return panels[:MAX_ITEMS]


def _value_panels(value: Any, ctx: Context, label: str, depth: int = 0) -> list[Panel]:
    """The panels of a stage value; [] when it holds nothing to draw."""
    value = _from_numpy(value)
    if isinstance(value, (list, tuple)):
        value = _numbers_to_tensor(value)
    if isinstance(value, torch.Tensor):
        return [_tensor_panel(value, ctx, label)]
    bag = _embedding_bag(value)
    if bag is not None:
        return [tokens_panel(bag[0], ctx, f"{label}: tokens" if label else "tokens", offsets=bag[1])]
    if isinstance(value, dict):
        if _is_detection(value):
            return [detections_panel([value], ctx, f"{label}: detections" if label else "detections")]
        if _is_score_dict(value):
            return [dict_bars_panel([value], ctx, label or "scores")]
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, dict) and _is_detection(v) for v in value) or _is_ts_detection(value):
            return [detections_panel(list(value), ctx, f"{label}: detections" if label else "detections")]
        if all(isinstance(v, dict) and _is_score_dict(v) for v in value):
            return [dict_bars_panel(list(value), ctx, label or "scores")]
        if _image_like(value) is not None and len({tuple(v.shape) for v in value[: ctx.max_images]}) == 1:
            return [_tensor_panel(torch.stack(list(value[: ctx.max_images])), ctx, label)]
        fields = getattr(value, "_fields", None)  # a NamedTuple: its field names
        items = list(zip(fields, value)) if fields else list(enumerate(value))
    else:
        return []
    panels = []
    for key, item in items[:MAX_ITEMS] if depth < 4 else ():
        path = f"[{key!r}]" if isinstance(value, dict) else f".{key}" if isinstance(key, str) else f"[{key}]"
        panels += _value_panels(item, ctx, f"{label}{path}", depth + 1)[:1]
    return panels


def _tensor_panel(x: torch.Tensor, ctx: Context, label: str) -> Panel:
    """The panel for one tensor: a card when it holds no values to draw, else `x` made a
    strided real tensor of at most 4 dims and handed to :func:`_pick`."""
    title = f"{label}: {tensor_head(x)}" if label else tensor_head(x)
    # The card's statistics are computed only for a card: a picture must not reduce a huge tensor.
    if x.is_nested or no_values(x):
        return card(title, [tensor_summary(x), "no values to draw"])
    if x.layout != torch.strided:
        if x.numel() > 2**24:
            return card(title, [tensor_summary(x), "a large sparse tensor: not drawn"])
        x = x.to_dense()
    if x.numel() == 0 or x.dim() == 0:
        return card(title, [tensor_summary(x), "empty: nothing to draw" if x.numel() == 0 else "a single value"])
    with torch.no_grad():
        x = x.detach()
        notes = []
        if x.is_quantized:
            x = x.dequantize()
        if x.is_complex():
            x = x.abs()
            notes.append("|x| of a complex tensor")
        x, lead = _leading(x, 4)
        panel = _pick(x, ctx, title)
    panel.notes = [n for n in [lead, *notes] if n] + panel.notes
    return panel


def _pick(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """The picture for a tensor of 1 to 4 dims (the table in the module docstring)."""
    view, dims = ctx.view, x.dim()
    width = len(view.mapping) if view.mapping else None
    if x.dtype == torch.bool:
        if dims == 3 or (dims == 4 and x.shape[1] == 1):
            return segmentation_panel(x.reshape(-1, *x.shape[-2:]), ctx, f"{title}: masks")
        if dims == 4:
            return segmentation_panel(x, ctx, f"{title}: masks")
        return histogram_panel(x, title)
    if x.dtype == torch.uint8 and dims in (3, 4) and x.shape[-3] in (1, 3):
        return images_panel(x if dims == 4 else x.unsqueeze(0), ctx, title)
    if x.dtype == torch.uint8 and dims == 2 and view.lookup is None:  # a grey image, not token ids
        return heatmap_panel(x, title)
    if not x.is_floating_point():
        if dims == 3 or (dims == 4 and x.shape[1] == 1):
            return segmentation_panel(x.reshape(-1, *x.shape[-2:]), ctx, f"{title}: segmentation")
        if dims == 2 and (view.lookup is not None or (x.shape[0] <= 64 and x.shape[1] <= 4096)):
            return tokens_panel(x, ctx, f"{title}: tokens")
        if dims == 1 and view.lookup is not None:
            return tokens_panel(x.unsqueeze(0), ctx, f"{title}: tokens")
        return histogram_panel(x, title)
    if dims == 4:
        channels = x.shape[1]
        same_size = ctx.image is not None and _spatial(ctx.image) == tuple(x.shape[-2:])
        if channels >= 2 and (
            (width == channels and (ctx.image is not None or channels not in (1, 3)))
            or (channels not in (1, 3) and same_size)
        ):
            return segmentation_panel(x, ctx, f"{title}: segmentation (argmax)")
        if channels in (1, 3):
            return images_panel(x, ctx, title)
        panel = features_panel(x[0], ctx, f"{title}: feature maps")
        if x.shape[0] > 1:
            panel.notes.insert(0, f"sample 0 of {x.shape[0]}")
        return panel
    if dims == 3:
        if x.shape[0] in (1, 3):
            return images_panel(x.unsqueeze(0), ctx, title)
        return features_panel(x, ctx, f"{title}: channels")
    if dims == 2:
        rows, k = x.shape
        if k >= 2 and (width == k or ctx.scores or (rows <= 16 and rows <= k <= 1000)):
            return bars_panel(x, ctx, f"{title}: top {min(ctx.top_k, k)}")
        return heatmap_panel(x, title)
    n = x.shape[0]
    if n >= 2 and (width == n or ctx.scores):
        return bars_panel(x.unsqueeze(0), ctx, f"{title}: top {min(ctx.top_k, n)}")
    if n <= 32:
        return values_panel(x, ctx, f"{title}: values")
    return histogram_panel(x, f"{title}: histogram")


# ---------------------------------------------------------------------------------------------
# Recognising structures
# ---------------------------------------------------------------------------------------------


def _image_like(value: Any) -> Any:
    """`value` when it is an image batch ([N, 1|3, H, W] or a list of [1|3, H, W]), else None."""
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.shape[1] in (1, 3) and value.numel():
        return value
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[0] in (1, 3) for v in value)
    ):
        return value
    return None


def _spatial(images: Any) -> tuple[int, int] | None:
    first = images[0] if isinstance(images, (list, tuple)) else images
    return tuple(first.shape[-2:]) if hasattr(first, "shape") else None


def _embedding_bag(value: Any) -> tuple[Any, Any] | None:
    """(ids, offsets) of EmbeddingBag input: a dict or NamedTuple with 1-d integer ``offsets``
    and another 1-d integer tensor (TorchServe's text handlers; handlerkit's TextBatch)."""
    fields = value._asdict() if hasattr(value, "_asdict") else value if isinstance(value, dict) else None
    if not fields:
        return None

    def ints_1d(v: Any) -> bool:
        return (
            isinstance(v, torch.Tensor)
            and v.dim() == 1
            and not v.is_floating_point()
            and not v.is_complex()
            and v.numel() > 0
        )

    offsets = fields.get("offsets")
    ids = next((v for k, v in fields.items() if k != "offsets" and ints_1d(v)), None)
    if ids is None or offsets is None or not ints_1d(offsets) or offsets.is_meta or ids.is_meta:
        return None
    return ids, offsets


def _is_detection(d: dict) -> bool:
    boxes = d.get("boxes")
    return boxes is not None and hasattr(boxes, "shape") and len(boxes.shape) == 2 and boxes.shape[-1] == 4


def _is_score_dict(d: dict) -> bool:
    return bool(d) and all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in d.items()
    )


def _is_ts_detection(value: Any) -> bool:
    """TorchServe's ObjectDetector output: per image, ``[{label: [x0, y0, x1, y1], "score": s}]``."""
    rows = [d for item in value if isinstance(item, list) for d in item]
    if not rows or not all(isinstance(item, list) for item in value):
        return False
    for d in rows:
        boxes = [v for k, v in d.items() if k != "score"] if isinstance(d, dict) else None
        if not boxes or len(boxes) != 1 or not isinstance(boxes[0], (list, tuple)) or len(boxes[0]) != 4:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Values as tensors
# ---------------------------------------------------------------------------------------------


def _from_numpy(value: Any) -> Any:
    import sys

    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and value.dtype.kind in "biufc":
        try:
            return torch.from_numpy(value)
        except ValueError:  # negative strides or a foreign byte order: a native, contiguous copy
            return torch.from_numpy(numpy.ascontiguousarray(value).astype(value.dtype.newbyteorder("="), copy=False))
        except TypeError:  # a dtype torch lacks (float128)
            return value
    return value


def _numbers_to_tensor(value: Any) -> Any:
    """A (nested) list of numbers as a tensor (``data.tolist()`` outputs), when it is regular
    and not too large to convert; else `value` unchanged."""
    count, probe = 1, value
    while isinstance(probe, (list, tuple)):
        if not probe:
            return value
        count *= len(probe)
        probe = probe[0]
    if isinstance(probe, bool) or not isinstance(probe, (int, float)) or count > 2**22:
        return value
    try:
        return torch.tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # ragged, or mixed with non-numbers
        return value


def _leading(x: torch.Tensor, ndim: int) -> tuple[torch.Tensor, str]:
    """Index 0 along the leading dims until `x` has `ndim` dims (a 5-d video → its first clip)."""
    if x.dim() <= ndim:
        return x, ""
    extra = x.dim() - ndim
    return x[(0,) * extra], f"index [{', '.join(['0'] * extra)}] of a {x.dim()}-d tensor"
