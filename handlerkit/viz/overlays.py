"""Overlays: segmentations and detections drawn on their input image (torchvision's drawing
utilities).

The input image comes from the result (the Run's preprocess output, ``StageResult.input``) and
is de-normalised like the image grid; without one, a dark canvas stands in. Masks and boxes
are drawn at the grid's bounded size, coloured by class with the legend's colours.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from handlerkit.viz.images import grid, unit_images
from handlerkit.viz.panel import Context, Panel, cell_side, first, shrink

__all__ = ["ALPHA", "PALETTE", "colour", "detections_panel", "image_at", "pixel_classes_panel", "segmentation_panel"]

MAX_BOXES = 50
MAX_CLASSES = 20
ALPHA = 0.7  # the opacity of a segmentation's class colours over the grey input image
_CANVAS = 40  # grey level of the canvas drawn on when there is no input image
# matplotlib's tab10, so class colours in overlays match their legend.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def colour(index: int) -> str:
    """The colour of class `index` (cycling through ``PALETTE``)."""
    return PALETTE[index % len(PALETTE)]


def image_at(images: Any, index: int) -> torch.Tensor | None:
    """Image `index` ([C, H, W]) of an input batch or list of images, when there is one."""
    if isinstance(images, torch.Tensor) and images.dim() == 4 and index < images.shape[0]:
        item = images[index]
    elif isinstance(images, (list, tuple)) and index < len(images) and isinstance(images[index], torch.Tensor):
        item = images[index]
    else:
        return None
    if item.dim() != 3 or item.shape[0] not in (1, 3) or item.numel() == 0 or item.is_meta:
        return None
    return item


def _base(ctx: Context, index: int, height: int, width: int) -> tuple[torch.Tensor, str]:
    """The uint8 [3, height, width] picture to draw on: the input image, resized, or a canvas."""
    image = image_at(ctx.image, index)
    if image is None:
        return torch.full((3, height, width), _CANVAS, dtype=torch.uint8), ""
    small, _ = shrink(image, 2 * max(height, width))
    x01, note = unit_images(small.unsqueeze(0), ctx.view)
    if x01.shape[-2:] != (height, width):
        x01 = torch.nn.functional.interpolate(
            x01, size=(height, width), mode="bilinear", antialias=True, align_corners=False
        )
    x01 = x01[0].expand(3, -1, -1) if x01.shape[1] == 1 else x01[0]
    return (x01.clamp(0, 1) * 255).round().to(torch.uint8).cpu(), note


def segmentation_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """[N, K, H, W] scores (argmax per pixel), [N, K, H, W] bool masks or an [N, H, W] class map,
    as masks in the legend's colours over the input image in grey; background classes are left
    clear, and the legend lists only the classes present.

    The masks are a layer of their own (``data["mask"]``, RGBA): each class's pixels hold its
    legend colour exactly, with ``ALPHA`` as their opacity, drawn over the grey image. Over grey
    the colour keeps its hue (a blend over a coloured photo turns orange into red); a legend
    patch and a class's pixels are the same colour."""
    x, n_note = first(x, ctx.max_images, "images")
    x, step = shrink(x, cell_side(x.shape[0]))
    if x.dim() == 4 and x.dtype == torch.bool:  # one mask per class, overlapping allowed
        tally = dict(enumerate(x.flatten(2).sum(2).sum(0).tolist()))
        masks_of = lambda i, c: x[i, c]
    else:
        classes = x.float().nan_to_num(nan=-torch.inf).argmax(1) if x.dim() == 4 else x.long()
        values, counts = torch.unique(classes, return_counts=True)
        tally = dict(zip(values.tolist(), counts.tolist()))
        masks_of = lambda i, c: classes[i] == c
    present = [c for c, n in sorted(tally.items(), key=lambda kv: -kv[1]) if n > 0]
    present = sorted([c for c in present if c >= 0 and not ctx.view.is_background(c)][:MAX_CLASSES])
    bases, layers, notes = [], [], [n for n in (n_note, f"every {step}th pixel" if step > 1 else "") if n]
    height, width = x.shape[-2], x.shape[-1]
    for i in range(x.shape[0]):
        base, note = _base(ctx, i, height, width)
        if note and note not in notes:
            notes.append(note)
        bases.append(base.float().mean(0, keepdim=True).round().to(torch.uint8).expand(3, -1, -1))
        layer = torch.zeros(4, height, width)
        for c in present:  # a later class over an earlier one where bool masks overlap
            mask = masks_of(i, c).cpu()
            layer[:, mask] = torch.tensor([*_rgb(colour(c)), ALPHA]).view(4, 1)
        layers.append(layer)
    if image_at(ctx.image, 0) is None:
        notes.append("no input image known: masks on a dark canvas (pass image=...)")
    else:
        notes.append("the input image in grey under the classes' colours")
    legend = [(ctx.view.label(c), colour(c)) for c in present]
    if not present:
        notes.append("every pixel is background")
    data = {"grid": grid(bases), "mask": grid(layers, pad_value=0.0), "legend": legend}
    return Panel("overlay", title, data, notes, size=(4.8, 4.6))


def pixel_classes_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel | None:
    """A segmenter's answer, ``[class, probability]`` per pixel (``[N, H, W, 2]``, TorchServe's
    image_segmenter's lists), as its class mask over the input image; None (decline) for other
    tensors: the classes must be whole numbers from 0 and the probabilities in [0, 1]."""
    if not (
        ctx.model_output
        and x.is_floating_point()
        and x.dim() == 4
        and x.shape[-1] == 2
        and x.numel() > 0
        and min(x.shape[1:3]) >= 4
    ):
        return None
    step = max(1, int((x.numel() / 2 / 65536) ** 0.5))
    probe = x[:, ::step, ::step]
    classes, probabilities = probe[..., 0], probe[..., 1]
    if not (
        bool((classes == classes.round()).all())
        and bool((classes >= 0).all())
        and bool(((probabilities >= 0) & (probabilities <= 1)).all())
    ):
        return None
    panel = segmentation_panel(x[..., 0].round().long(), ctx, f"{title}: class per pixel")
    panel.notes.insert(0, "the answer's [class, probability] pairs: each pixel's class drawn")
    return panel


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    return (int(hex_colour[1:3], 16) / 255, int(hex_colour[3:5], 16) / 255, int(hex_colour[5:7], 16) / 255)


def _box_rows(item: Any, ctx: Context, named: dict[str, int]) -> tuple[torch.Tensor, list[str], list[int], Any]:
    """boxes [M, 4], label texts, colour indices and masks of one image's detections, the
    highest scores first, at most ``MAX_BOXES``; malformed rows dropped. Labels given as names
    get colours in order of appearance (`named`)."""
    if isinstance(item, dict):  # torchvision: {"boxes": [M, 4], "labels": [M], "scores": [M], "masks"?}
        boxes = torch.as_tensor(item.get("boxes"), dtype=torch.float32).reshape(-1, 4)
        m = boxes.shape[0]
        labels = item.get("labels")
        labels = torch.as_tensor(labels).reshape(-1).tolist() if labels is not None else [None] * m
        scores = item.get("scores")
        scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1).tolist() if scores is not None else None
        masks = item.get("masks")
    else:  # TorchServe's ObjectDetector: [{label: [x0, y0, x1, y1], "score": s}, ...]
        rows = [(k, v, d.get("score")) for d in item for k, v in d.items() if k != "score"]
        boxes = torch.tensor([list(map(float, v)) for _, v, _ in rows], dtype=torch.float32).reshape(-1, 4)
        labels = [k for k, _, _ in rows]
        scores = [float(s) if s is not None else math.nan for _, _, s in rows]
        masks = None
    m = boxes.shape[0]
    labels = (labels + [None] * m)[:m]
    order = list(range(m))
    if scores is not None:
        order.sort(key=lambda j: -scores[j] if j < len(scores) and scores[j] == scores[j] else math.inf)
    order = [j for j in order if bool(torch.isfinite(boxes[j]).all())][:MAX_BOXES]
    texts, colours = [], []
    for j in order:
        label = labels[j]
        index = label if isinstance(label, int) else None
        name = ctx.view.label(label) if isinstance(label, int) else ("" if label is None else str(label))
        score = scores[j] if scores is not None and j < len(scores) else None
        texts.append(f"{name} {score:.2f}".strip() if score is not None and score == score else name)
        colours.append(index if index is not None else _class_index(ctx, name, named))
    b = boxes[order] if order else boxes[:0]
    b = torch.stack(
        [
            torch.minimum(b[:, 0], b[:, 2]),
            torch.minimum(b[:, 1], b[:, 3]),
            torch.maximum(b[:, 0], b[:, 2]),
            torch.maximum(b[:, 1], b[:, 3]),
        ],
        dim=1,
    )
    if isinstance(masks, torch.Tensor) and masks.shape[0] == m:
        masks = masks[order]
    else:
        masks = None
    return b, texts, colours, masks


def _class_index(ctx: Context, name: str, named: dict[str, int]) -> int:
    """A label given by name: its class index in the mapping (so a class keeps one colour across
    a run's panels, indices in one and names in the next), else its order of appearance."""
    for key, label in (ctx.view.mapping or {}).items():
        if label == name:
            return int(key)
    return named.setdefault(name, len(named))


def detections_panel(items: list[Any], ctx: Context, title: str) -> Panel:
    """Per image, boxes with ``label score`` on the input image (torchvision's or TorchServe's format)."""
    from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

    shown = items[: ctx.max_images]
    side = cell_side(len(shown))
    notes = [f"first {len(shown)} of {len(items)} images"] if len(shown) < len(items) else []
    drawn, total = [], 0
    named: dict[Any, Any] = {}
    font = _font()
    for i, item in enumerate(shown):
        boxes, texts, colours, masks = _box_rows(item, ctx, named)
        total += boxes.shape[0]
        image = image_at(ctx.image, i)
        if image is not None:
            height, width = image.shape[-2:]
        else:  # a canvas that holds every box
            height = int(boxes[:, 3].max().item()) + 16 if boxes.numel() else 64
            width = int(boxes[:, 2].max().item()) + 16 if boxes.numel() else 64
        scale = min(1.0, side / max(height, width, 1))
        h, w = max(1, round(height * scale)), max(1, round(width * scale))
        base, note = _base(ctx, i, h, w)
        if note and note not in notes:
            notes.append(note)
        if masks is not None and masks.numel():
            small = torch.nn.functional.interpolate(masks.float().reshape(-1, 1, *masks.shape[-2:]), size=(h, w))
            base = draw_segmentation_masks(base, small[:, 0] > 0.5, alpha=0.45, colors=[colour(c) for c in colours])
        if boxes.numel():
            scaled = (boxes * scale).clamp(min=0).cpu()
            palette = [colour(c) for c in colours]
            base = draw_bounding_boxes(
                base,
                scaled,
                labels=texts,
                colors=palette,
                width=max(2, round(max(h, w) / 120)),
                font=font,
                font_size=max(10, round(max(h, w) / 16)),
                label_colors="white",
                label_background_colors=palette,
                fill_labels=True,
            )
        drawn.append(base)
    if image_at(ctx.image, 0) is None:
        notes.append("no input image known: boxes on a dark canvas (pass image=...)")
    notes.append(f"{total} boxes (at most {MAX_BOXES} per image, highest scores)" if total else "no boxes")
    return Panel("overlay", title, {"grid": grid(drawn), "legend": []}, notes, size=(4.8, 4.6))


def _font() -> str | None:
    """matplotlib's DejaVu Sans, so box labels are legible (PIL's default font is tiny)."""
    import os

    import matplotlib

    path = os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSans.ttf")
    return path if os.path.isfile(path) else None
