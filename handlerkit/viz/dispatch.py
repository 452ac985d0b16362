"""Which picture fits which data: the one place ``hk.show`` decides.

The picture follows what the data is, not which handler made it. Everything below only
recognises what came and hands it to a panel module (``images``, ``bars``, ``lines``,
``histogram``, ``overlays``, ``tokens``, ``tables``, ``cards``); the panels build the bounded
data, ``draw`` draws it. To change which picture a value gets, change this module alone.

How the picture is chosen, for a tensor (5-d and more: its first 4-d slice). *Image-sized*:
the last two dims both at least 4 and neither more than 32 times the other. A *model output*
is the value of any stage but preprocess (the model's input is never labelled with its
classes); a value given alone may be one, labelled only from the ``handler=`` its caller chose.

=========================================  ===================================================
``[N, 1|3, H, W]`` image-sized floats or   an image grid, de-normalised (``[1|3, H, W]`` too)
uint8
``[N, C, H, W]`` image-sized floats,       a segmentation (argmax per pixel over the input
other C                                    image) when C is the mapping's width or H, W the
                                           input image's; else sample 0's channels as
                                           feature maps (``[C, H, W]`` likewise)
``[N, H, W]`` image-sized integers or      a segmentation mask over the input image
booleans
``[N, L, K]`` floats, a model output with  class scores per position (a tagger's): a heat
K the mapping's width                      map, a row per ``[n, l]``, a column per class
3-d and 4-d, not image-sized               a row per leading index (``[N, 1, T]`` audio:
                                           ``[N, T]``), then as 2-d
``[N, K]`` floats, a model output with K   top-k bars per row labelled from the mapping
the mapping's width                        (softmax of logits)
``[N, T]`` floats, N ≤ 8, T ≥ 64           signals: a line per row
other ``[N, F]`` floats, 0/1 integers      a heat map, each value written in when it is at
                                           most 24 × 12 (a feature table)
``[N, L]`` integers                        a table of vocabulary entries (ids without one)
``[K]`` floats                             a model output of the mapping's width: bars;
                                           else ≤ 32 values one bar each, more a line
``[N]`` integers                           a token table with a vocabulary, else a histogram
empty, 0-d, meta or fake tensors           a summary card saying why there is no picture
=========================================  ===================================================

int16 tensors are PCM samples (audio's format), drawn as floats; token ids are int32/int64.
Other values: numpy arrays and regular lists of numbers as tensors; bytes PIL decodes as an
image (or a list of them) as those images; torchvision detections (``[{"boxes", "labels",
"scores"}]``) or TorchServe's detector output as boxes on the input image; ``{label:
probability}`` dicts as bars; EmbeddingBag input (ids + offsets) as a token table; a list of
same-sized images as one batch; JSON-like values (strings, lists of dicts, ragged lists: what a
postprocess answers) as a table; other lists and dicts one panel per item (at most six). A Run
shows its error first when it failed (``error``), its chunk timeline when it streamed
(``chunks``), then one panel per stage; a failed stage shows its error and fix, and so does a
``StageError`` (saying where the harness keeps the input the stage failed on). ``hk.Sequences``
(or a list of its steps) shows its per-step batches, requests × steps. Anything else is a
summary card whose last line says why there is no picture.
"""

from __future__ import annotations

import itertools
import numbers
from typing import Any

import torch

from handlerkit.errors import StageError
from handlerkit.results import Run, StageResult
from handlerkit.sequences import Sequences, Step
from handlerkit.summaries import describe, no_values, tensor_head
from handlerkit.viz.audio import audio_panels, batch_panels
from handlerkit.viz.bars import bars_panel, dict_bars_panel, values_panel
from handlerkit.viz.cards import card, error_card, summary_card
from handlerkit.viz.chunks import timeline_panel
from handlerkit.viz.explanations import attributions_panel
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.histogram import histogram_panel
from handlerkit.viz.images import encoded_images_panel, features_panel, heatmap_panel, images_panel
from handlerkit.viz.lines import MAX_LINES, lines_panel
from handlerkit.viz.maps import maps_panel
from handlerkit.viz.overlays import detections_panel, pixel_classes_panel, segmentation_panel
from handlerkit.viz.panel import Context, Panel
from handlerkit.viz.steps import steps_panel
from handlerkit.viz.tables import json_table_panel
from handlerkit.viz.tokens import tokens_panel

__all__ = ["MAX_ITEMS", "panels_for"]

MAX_ITEMS = 6  # panels for the items of a list or dict
SIGNAL = 64  # the shortest row drawn as a line
MAX_VALUES = 32  # the longest 1-d tensor drawn as one bar per value
_DRAWN = "a tensor, an array, image bytes, text or JSON data"


def panels_for(obj: Any, view: HandlerView, *, image: Any = None, top_k: int = 5, max_images: int = 16) -> list[Panel]:
    """The panels of `obj` (a StageResult, a Run, or a value), using what `view` knows of the
    handler; `image` overrides the input image the overlays are drawn on. A value without a
    picture gets a summary card that says why."""

    def context(input_image: Any, stage: str | None) -> Context:
        return Context(view, top_k, max_images, image if image is not None else input_image, stage)

    if isinstance(obj, StageError):
        return [error_card(obj)]
    if isinstance(obj, StageResult):
        if obj.error is not None:
            return [error_card(obj)]
        label = f"{obj.stage} output"
        panels = _value_panels(obj.output, context(_image_like(obj.input), obj.stage), label)
        return panels or [summary_card(label, obj.output, _why(obj.output))]
    if isinstance(obj, Run):
        return _run_panels(obj, context)
    if isinstance(obj, Sequences) or (isinstance(obj, list) and obj and all(isinstance(s, Step) for s in obj)):
        return [steps_panel(obj)]
    return _value_panels(obj, context(None, None), "") or [summary_card(describe(obj), obj, _why(obj))]


def _run_panels(run: Run, context: Any) -> list[Panel]:
    """A failed run's error first; the chunk timeline of a streamed run; then one panel per
    stage (the first of each), the input image taken from preprocess."""
    pre = run.stages.get("preprocess")
    input_image = _image_like(pre.output) if pre is not None and pre.ok else None
    failed = next((r for r in run.stages.values() if r.error is not None and r.error is run.error), None)
    panels: list[Panel] = [error_card(failed)] if failed is not None else []
    panels += [timeline_panel(run)] if run.chunks else []
    for name, result in run.stages.items():
        if result is failed:
            continue
        if result.error is not None:
            panels.append(error_card(result))
        elif name != "initialize":
            drawn = _value_panels(result.output, context(input_image, name), f"{name} output")[:1]
            if name == "postprocess" and drawn and drawn[0].kind == "bars" and any(p.kind == "bars" for p in panels):
                continue  # the classifier's probabilities again, as dicts
            panels += drawn
    if not panels:  # (a streamed run has its timeline)
        lines = [f"{name}: {describe(r.output)}" for name, r in run.stages.items()]
        lines.append(f"No picture: no stage returned {_DRAWN}.")
        panels = [card(f"Run of {run.batch_size} request(s): nothing to draw", lines)]
    return panels[:MAX_ITEMS]


def _value_panels(value: Any, ctx: Context, label: str, depth: int = 0) -> list[Panel]:
    """The panels of a stage value; [] when it holds nothing to draw."""
    drawn = batch_panels(value, ctx, label, draw=_value_panels)  # until the registry's chain holds them
    drawn = drawn if drawn is not None else audio_panels(value, ctx, label)
    if drawn is not None:
        return drawn
    value = _from_numpy(value)
    if isinstance(value, (list, tuple)):
        value = _numbers_to_tensor(value)
    if isinstance(value, torch.Tensor):
        return [_tensor_panel(value, ctx, label)]
    titled = f"{label}: {describe(value)}" if label else describe(value)
    if _encoded(value):
        items = [value] if _is_bytes(value) else list(value)
        return [encoded_images_panel(items, ctx, titled)]
    bag = _embedding_bag(value)
    if bag is not None:
        return [tokens_panel(bag[0], ctx, f"{label}: tokens" if label else "tokens", offsets=bag[1])]
    if isinstance(value, str):
        return [json_table_panel(value, titled)] if value else []
    if isinstance(value, dict):
        if _is_detection(value):
            return [detections_panel([value], ctx, f"{label}: detections" if label else "detections")]
        if _is_score_dict(value):
            return [dict_bars_panel([value], ctx, label or "scores")]
        if value and _json_like(value):
            return [json_table_panel(value, titled)]
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, dict) and _is_detection(v) for v in value) or _is_ts_detection(value):
            return [detections_panel(list(value), ctx, f"{label}: detections" if label else "detections")]
        if all(isinstance(v, dict) and _is_score_dict(v) for v in value):
            return [dict_bars_panel(list(value), ctx, label or "scores")]
        if _image_like(value) is not None and len({tuple(v.shape) for v in value[: ctx.max_images]}) == 1:
            return [_tensor_panel(torch.stack(list(value[: ctx.max_images])), ctx, label)]
        if _json_like(value):
            return [json_table_panel(value, titled)]
        fields = getattr(value, "_fields", None)  # a NamedTuple: its field names
        items = list(zip(fields, value)) if fields else list(enumerate(value))
    else:
        return []
    panels = []
    for key, item in items[:MAX_ITEMS] if depth < 4 else ():
        path = f"[{key!r}]" if isinstance(value, dict) else f".{key}" if isinstance(key, str) else f"[{key}]"
        panels += _value_panels(item, ctx, f"{label}{path}", depth + 1)[:1]
    return panels


def _why(value: Any) -> str:
    """Why a value that holds no tensor, bytes or text has no picture, as the end of a sentence."""
    if value is None:
        return "the value is None"
    if isinstance(value, numbers.Number):
        return f"{value!r} is a single number"
    if isinstance(value, (str, list, tuple, dict)) and not value:
        return "it is empty"
    if isinstance(value, (list, tuple, dict)):
        return f"none of its items is {_DRAWN}"
    return f"a value of type {type(value).__name__} is not {_DRAWN}"


def _tensor_panel(x: torch.Tensor, ctx: Context, label: str) -> Panel:
    """The panel for one tensor: a card when it holds no values to draw, else `x` made a
    strided real tensor of at most 4 dims and handed to :func:`_pick`."""
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
    """The picture for a tensor of 1 to 4 dims (the table in the module docstring)."""
    for kind in (attributions_panel, pixel_classes_panel, maps_panel):  # until the registry's chain holds them
        picked = kind(x, ctx, title)
        if picked is not None:
            return picked
    view, dims = ctx.view, x.dim()
    width = len(view.mapping) if view.mapping else None
    if dims == 3 and x.is_floating_point() and width and width >= 2 and x.shape[-1] == width and ctx.model_output:
        return _scores_per_position(x, ctx, title)
    if dims >= 3 and not _image_sized(x.shape[-2], x.shape[-1]):
        return _rows(x, ctx, title)
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
        head = x[:64, :4096] if dims == 2 else x
        if dims == 2 and bool(((head == 0) | (head == 1)).all()):  # an attention mask, not token ids
            return heatmap_panel(x, f"{title}: 0/1")
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
        if k >= 2 and k == width and ctx.model_output:
            return bars_panel(x, ctx, f"{title}: top {min(ctx.top_k, k)}")
        if rows <= MAX_LINES and k >= SIGNAL:
            return lines_panel(x, f"{title}: signals" if rows > 1 else f"{title}: signal")
        return heatmap_panel(x, title)
    n = x.shape[0]
    if n >= 2 and n == width and ctx.model_output:
        return bars_panel(x.unsqueeze(0), ctx, f"{title}: top {min(ctx.top_k, n)}")
    if n <= MAX_VALUES:
        return values_panel(x, f"{title}: values")
    return lines_panel(x.unsqueeze(0), f"{title}: signal")


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


# ---------------------------------------------------------------------------------------------
# Recognising structures
# ---------------------------------------------------------------------------------------------


def _image_sized(height: int, width: int) -> bool:
    """Two dims that can be an image's: both at least 4, neither 32 times the other."""
    return min(height, width) >= 4 and max(height, width) <= 32 * min(height, width)


def _image_like(value: Any) -> Any:
    """`value` when it is an image batch ([N, 1|3, H, W] or a list of [1|3, H, W]), else None."""
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 4
        and value.shape[1] in (1, 3)
        and value.numel()
        and _image_sized(*value.shape[-2:])
    ):
        return value
    if (
        isinstance(value, (list, tuple))
        and value
        and all(
            isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[0] in (1, 3) and _image_sized(*v.shape[-2:])
            for v in value
        )
    ):
        return value
    return None


def _spatial(images: Any) -> tuple[int, int] | None:
    first = images[0] if isinstance(images, (list, tuple)) else images
    return tuple(first.shape[-2:]) if hasattr(first, "shape") else None


def _is_bytes(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def _encoded(value: Any) -> bool:
    """Bytes (what TorchServe passes through to the client), or a list of them."""
    if _is_bytes(value):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_bytes(v) for v in value)


def _json_like(value: Any) -> bool:
    """Strings, numbers, booleans and None in lists and dicts: JSON, as a postprocess answers.
    A bounded look: 64 items of each container, 6 levels, 2,000 values."""
    budget = [2000]

    def walk(v: Any, depth: int) -> bool:
        budget[0] -= 1
        if budget[0] < 0 or v is None or isinstance(v, (str, numbers.Number)):
            return not isinstance(v, complex)
        if depth >= 6:
            return False
        if isinstance(v, dict):
            return all(walk(item, depth + 1) for item in itertools.islice(v.values(), 64))
        if isinstance(v, (list, tuple)):
            return all(walk(item, depth + 1) for item in v[:64])
        return False

    return walk(value, 0)


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
