"""The built-in pictures of values and Runs, in the order ``hk.show`` tries them: ``VALUES``.

The picture follows what the data is, not which handler made it. Each picture is a function
that recognises what came and hands it to a panel module (``images``, ``bars``, ``lines``,
``histogram``, ``overlays``, ``tokens``, ``tables``, ``cards``), or declines (returns None); the
panels build the bounded data, ``draw`` draws it. ``registry`` tries the user's pictures
(``hk.show.register``, ``__handlerkit_show__``) first, then ``VALUES`` here, in this order; the
``tensor`` picture hands a tensor to ``tensors.TENSORS`` (its own chain and table). To add a
built-in picture, add it to a chain before the first picture it must precede, one line each
(here, below the chain's list): ``VALUES.add(waveform_panels, before="encoded_images")``,
``TENSORS.add(spectrogram_panel, before="image_grid")``, and give it a row in the table.

``VALUES``, ``(value, ctx, label) -> list[Panel] | None``:

========================  ========================================================================
``request_batch``         a request ``Batch``: one panel per request, its input drawn (audio as a
                          waveform with its player, anything else by these pictures)
``numpy_array``           a numeric numpy array: as the tensor it is
``numbers``               a regular (nested) list of numbers: as a tensor
``tensor``                a tensor: the first of ``TENSORS`` that draws it (table below)
``wav_audio``             WAV bytes (or a list of them): a waveform, a line per clip, with a player
``encoded_images``        bytes PIL decodes as an image (or a list of them): those images
``embedding_bag_tokens``  EmbeddingBag input (ids + offsets, a dict or NamedTuple): a token table
``text``                  a string: a table of one row
``failed_requests``       answers where some are ``{"code", "error", "fix"}`` items: the others'
                          picture, then a card per failed request with its error and fix
``detections``            torchvision detections (``{"boxes", "labels", "scores"}``) or TorchServe's
                          detector output: boxes on the input image
``score_dicts``           ``{label: probability}`` dicts: top-k bars
``image_list``            a list of same-sized ``[1|3, H, W]`` images (or ``[1, 1|3, H, W]``): one batch
``ranked_lists``          per request, a (ragged) list of flat dicts (``[{"item_id", "score"}]``): an
                          HTML table, a row per record, every value whole
``json``                  other JSON-like values (what a postprocess answers): a table
``items``                 other lists, tuples, NamedTuples and dicts: each item's pictures (six at
                          most), named by its path
========================  ========================================================================

``TENSORS`` (the pictures of a tensor) are in ``tensors``, with their table.

A Run shows its error first when it failed (``error``), its chunk timeline and
chunk texts when it streamed (``chunks``), then every stage's pictures (a value an earlier stage
drew, the same object passed on, is not drawn again; at most ``MAX_RUN_PANELS``); a failed stage
shows its error and fix, and so does a ``StageError`` (saying where the harness keeps the input
the stage failed on). ``hk.Sequences`` (or a list of its steps) shows its per-step batches,
requests × steps. Anything else is a summary card whose last line says why there is no picture.
"""

from __future__ import annotations

import functools
import itertools
import numbers
from dataclasses import replace
from typing import Any

import torch

from handlerkit.errors import StageError
from handlerkit.recording.results import Run, StageResult
from handlerkit.sequences import Sequences, Step
from handlerkit.summaries import describe
from handlerkit.viz.audio import audio_panels, batch_panels
from handlerkit.viz.bars import dict_bars_panel
from handlerkit.viz.cards import card, error_card, summary_card
from handlerkit.viz.chunks import chunk_panels
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.images import encoded_images_panel
from handlerkit.viz.overlays import detections_panel
from handlerkit.viz.panel import Context, Panel
from handlerkit.viz.registry import Chain, user_panels
from handlerkit.viz.steps import steps_panel
from handlerkit.viz.tables import json_table_panel, records_panel, table_html
from handlerkit.viz.tensors import TENSORS, image_sized, tensor_panel
from handlerkit.viz.tokens import tokens_panel

__all__ = ["MAX_ITEMS", "MAX_RUN_PANELS", "TENSORS", "VALUES", "panels_for", "tensor_panel", "value_panels"]

MAX_ITEMS = 6  # panels for the items of a list or dict
MAX_RUN_PANELS = 9  # panels of a Run (three rows of three)
_DRAWN = "a tensor, an array, image bytes, text or JSON data"

#: The built-in pictures of a value, ``(value, ctx, label) -> list[Panel] | None``, most specific first.
VALUES = Chain("show's pictures of values")


def panels_for(obj: Any, view: HandlerView, *, image: Any = None, top_k: int = 5, max_images: int = 16) -> list[Panel]:
    """The panels of `obj` (a StageResult, a Run, or a value), using what `view` knows of the
    handler; `image` overrides the input image the overlays are drawn on. A value without a
    picture gets a summary card that says why."""

    def context(input_image: Any, stage: str | None) -> Context:
        return Context(view, top_k, max_images, image if image is not None else input_image, stage, chain=value_panels)

    if isinstance(obj, StageError):
        return [error_card(obj)]
    if isinstance(obj, StageResult):
        if obj.error is not None:
            return [error_card(obj)]
        label = f"{obj.stage} output"
        panels = value_panels(obj.output, context(_image_like(obj.input), obj.stage), label)
        return panels or [summary_card(label, obj.output, _why(obj.output))]
    if isinstance(obj, Run):
        return _run_panels(obj, context)
    if isinstance(obj, Sequences) or (isinstance(obj, list) and obj and all(isinstance(s, Step) for s in obj)):
        return [steps_panel(obj)]
    return value_panels(obj, context(None, None), "") or [summary_card(describe(obj), obj, _why(obj))]


def value_panels(value: Any, ctx: Context, label: str) -> list[Panel]:
    """The panels of a value: the first answer of the user's pictures, then of ``VALUES``;
    [] when none draws it."""
    if ctx.depth > 4:
        return []
    if ctx.seen is not None and not _scalar(value) and not isinstance(value, (bytes, bytearray)):
        if id(value) in ctx.seen:  # in a Run: an earlier stage's value passed on, drawn there
            return []
        ctx.seen[id(value)] = value  # kept alive, so its id is not reused by another value
    return user_panels(value, ctx, label) or VALUES.first(value, ctx, label) or []


def _run_panels(run: Run, context: Any) -> list[Panel]:
    """A failed run's error first; the chunk timeline and texts of a streamed run; then every
    panel of each stage (a tensor an earlier stage drew, the same object, is not drawn again),
    the input image taken from preprocess."""
    pre = run.stages.get("preprocess")
    input_image = _image_like(pre.output) if pre is not None and pre.ok else None
    failed = next((r for r in run.stages.values() if r.error is not None and r.error is run.error), None)
    panels: list[Panel] = [error_card(failed)] if failed is not None else []
    panels += chunk_panels(run) if run.chunks else []
    seen: dict[int, Any] = {}
    for name, result in run.stages.items():
        if result is failed:
            continue
        if result.error is not None:
            panels.append(error_card(result))
        elif name != "initialize":
            ctx = context(input_image, name)
            ctx.seen = seen
            drawn = value_panels(result.output, ctx, f"{name} output")
            if run.chunks:  # text beside the chunks' table: HTML too; the answers are in that table
                drawn = [table_html(p) for p in drawn if p.kind != "table" or name == "preprocess"]
            if name == "postprocess" and any(p.kind == "bars" for p in panels):
                drawn = [p for p in drawn if p.kind != "bars"]  # the classifier's probabilities again, as dicts
            panels += drawn
    if not panels:  # (a streamed run has its timeline)
        lines = [f"{name}: {describe(r.output)}" for name, r in run.stages.items()]
        lines.append(f"No picture: no stage returned {_DRAWN}.")
        panels = [card(f"Run of {run.batch_size} request(s): nothing to draw", lines)]
    if len(panels) > MAX_RUN_PANELS:
        left = panels[MAX_RUN_PANELS - 1 :]
        panels = panels[: MAX_RUN_PANELS - 1]
        panels.append(
            card(f"{len(left)} more panels", [p.title for p in left] + ["hk.show(run.stages[name]) draws a stage's"])
        )
    return panels


# ---------------------------------------------------------------------------------------------
# The built-in pictures of values, most specific first
# ---------------------------------------------------------------------------------------------


def _numpy_array(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """A numeric numpy array, as the tensor it is."""
    converted = _from_numpy(value)
    return None if converted is value else value_panels(converted, ctx, label)


def _numbers(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """A regular (nested) list of numbers, as a tensor."""
    if not isinstance(value, (list, tuple)):
        return None
    converted = _numbers_to_tensor(value)
    return None if converted is value else value_panels(converted, ctx, label)


def _tensor(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    if not isinstance(value, torch.Tensor):
        return None
    return [tensor_panel(value, ctx, label)]


def _encoded_images(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    if not _encoded(value):
        return None
    items = [value] if _is_bytes(value) else list(value)
    return [encoded_images_panel(items, ctx, _titled(label, value))]


def _embedding_bag_tokens(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    bag = _embedding_bag(value)
    if bag is None:
        return None
    return [tokens_panel(bag[0], ctx, f"{label}: tokens" if label else "tokens", offsets=bag[1])]


def _text(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    if not isinstance(value, str):
        return None
    return [json_table_panel(value, _titled(label, value))] if value else []


def _failed_requests(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """Answers where some requests failed (``{"code", "error", "fix"}`` items): the others'
    picture, then a card per failed request with its error and fix."""
    if not isinstance(value, (list, tuple)) or not any(_is_error_item(v) for v in value):
        return None
    good = [v for v in value if not _is_error_item(v)]
    which = [i for i, v in enumerate(value) if not _is_error_item(v)]
    panels = value_panels(good, ctx, f"{label} of requests {which}" if label else f"requests {which}") if good else []
    for i, item in enumerate(value):
        if _is_error_item(item):
            code = f" ({item['code']})" if item.get("code") is not None else ""
            lines = [f"error: {item.get('error')}", f"fix: {item.get('fix')}"]
            lines += [f"{k}: {v}" for k, v in item.items() if k not in ("code", "error", "fix")]
            panels.append(
                card(f"{label}[{i}]: request {i} failed{code}" if label else f"request {i} failed{code}", lines)
            )
    return panels


def _detections(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    title = f"{label}: detections" if label else "detections"
    if isinstance(value, dict) and _is_detection(value):
        return [detections_panel([value], ctx, title)]
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, dict) and _is_detection(v) for v in value) or _is_ts_detection(value):
            return [detections_panel(list(value), ctx, title)]
    return None


def _score_dicts(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    if isinstance(value, dict) and _is_score_dict(value):
        return [dict_bars_panel([value], ctx, label or "scores")]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) and _is_score_dict(v) for v in value):
        return [dict_bars_panel(list(value), ctx, label or "scores")]
    return None


def _image_list(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """A list of same-sized images (``[1|3, H, W]``, or batches of one ``[1, 1|3, H, W]``, as a
    handler that runs its requests one by one keeps them), as one batch."""
    if (
        isinstance(value, (list, tuple))
        and len(value) > 1
        and all(isinstance(v, torch.Tensor) and v.dim() == 4 and v.shape[0] == 1 for v in value)
    ):
        return _image_list([v[0] for v in value], ctx, label)
    if (
        isinstance(value, (list, tuple))
        and value
        and _image_like(value) is not None
        and len({tuple(v.shape) for v in value[: ctx.max_images]}) == 1
    ):
        return [tensor_panel(torch.stack(list(value[: ctx.max_images])), ctx, label)]
    return None


def _ranked_lists(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """Per request, a (ragged) list of flat records (a ranker's ``[{"item_id", "score"}]``): an
    HTML table, a row per record."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, (list, tuple)) for v in value):
        return None
    records = [r for v in value for r in v]
    if not records or not all(isinstance(r, dict) and r and all(_scalar(x) for x in r.values()) for r in records):
        return None
    return [records_panel(list(value), _titled(label, value))]


def _json(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    if isinstance(value, (dict, list, tuple)) and value and _json_like(value):
        return [json_table_panel(value, _titled(label, value))]
    return None


def _items(value: Any, ctx: Context, label: str) -> list[Panel] | None:
    """A list, tuple, NamedTuple or dict of other things: each item's pictures (the first
    ``MAX_ITEMS`` items)."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and value:
        fields = getattr(value, "_fields", None)  # a NamedTuple: its field names
        items = list(zip(fields, value)) if fields else list(enumerate(value))
    else:
        return None
    inner = replace(ctx, depth=ctx.depth + 1)
    panels: list[Panel] = []
    for key, item in items[:MAX_ITEMS]:
        path = f"[{key!r}]" if isinstance(value, dict) else f".{key}" if isinstance(key, str) else f"[{key}]"
        panels += value_panels(item, inner, f"{label}{path}")
    return panels


for _draw in (
    _numpy_array,
    _numbers,
    _tensor,
    _encoded_images,
    _embedding_bag_tokens,
    _text,
    _failed_requests,
    _detections,
    _score_dicts,
    _image_list,
    _ranked_lists,
    _json,
    _items,
):
    VALUES.add(_draw, name=_draw.__name__.lstrip("_"))
VALUES.add(functools.partial(batch_panels, draw=value_panels), name="request_batch", before="numpy_array")
VALUES.add(audio_panels, name="wav_audio", before="encoded_images")


def _titled(label: str, value: Any) -> str:
    return f"{label}: {describe(value)}" if label else describe(value)


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


# ---------------------------------------------------------------------------------------------
# Recognising structures
# ---------------------------------------------------------------------------------------------


def _image_like(value: Any) -> Any:
    """`value` when it is an image batch ([N, 1|3, H, W] or a list of [1|3, H, W]), else None."""
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 4
        and value.shape[1] in (1, 3)
        and value.numel()
        and image_sized(*value.shape[-2:])
    ):
        return value
    if (
        isinstance(value, (list, tuple))
        and value
        and all(
            isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[0] in (1, 3) and image_sized(*v.shape[-2:])
            for v in value
        )
    ):
        return value
    return None


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


def _is_error_item(v: Any) -> bool:
    """A failed request's answer (``error_item``): a dict with ``error`` and ``fix``."""
    return isinstance(v, dict) and "error" in v and "fix" in v


def _scalar(v: Any) -> bool:
    return v is None or (isinstance(v, (str, numbers.Number)) and not isinstance(v, complex))


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
