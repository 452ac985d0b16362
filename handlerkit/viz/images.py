"""Images and other 2-d pictures of values: image grids (de-normalised with the handler's
``Normalize``), encoded images (PNG, JPEG... bytes) decoded, a tensor's channels as feature
maps, and a matrix as a heat map (a small one, a feature table, with each value written in).

``unit_images`` and ``grid`` are shared with ``overlays``, which draw masks and boxes on the
same de-normalised input image.
"""

from __future__ import annotations

from typing import Any

import torch

from handlerkit.viz.cards import summary_card
from handlerkit.viz.handler_view import HandlerView
from handlerkit.viz.panel import MAX_SIDE, Context, Panel, cell_side, columns, finite_range, first, shrink

__all__ = [
    "MAX_VALUE_COLS",
    "MAX_VALUE_ROWS",
    "decode_image",
    "encoded_images_panel",
    "features_panel",
    "grid",
    "heatmap_panel",
    "images_panel",
    "pixel_scale",
    "unit_images",
]

MAX_VALUE_ROWS, MAX_VALUE_COLS = 24, 12  # the largest heat map with its values written in


def images_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """[N, C, H, W] (C 1 or 3) as a grid, de-normalised."""
    x, n_note = first(x, ctx.max_images, "images")
    x, step = shrink(x, cell_side(x.shape[0]))
    x01, note = unit_images(x, ctx.view)
    notes = [n for n in (n_note, note, f"every {step}th pixel" if step > 1 else "") if n]
    return Panel("images", title, {"grid": grid(x01)}, notes, size=(4.8, 4.4))


def features_panel(x: torch.Tensor, ctx: Context, title: str) -> Panel:
    """[C, H, W] as a grid of channels, each scaled to its own range."""
    x, c_note = first(x, ctx.max_images, "channels")
    x, step = shrink(x, cell_side(x.shape[0]))
    x = x.float()
    flat = x.flatten(1)
    finite = torch.isfinite(flat)
    low = torch.where(finite, flat, torch.inf).amin(1).view(-1, 1, 1)
    high = torch.where(finite, flat, -torch.inf).amax(1).view(-1, 1, 1)
    scaled = (x - low) / (high - low).clamp(min=1e-12)
    scaled = torch.where(torch.isfinite(x), scaled.clamp(0, 1), torch.nan)
    picture = grid(scaled.unsqueeze(1), pad_value=float("nan"))[..., 0]
    notes = [
        n for n in (c_note, "each channel scaled to its own range", f"every {step}th pixel" if step > 1 else "") if n
    ]
    return Panel("features", title, {"grid": picture}, notes, size=(4.8, 4.4))


def heatmap_panel(
    x: torch.Tensor, title: str, *, row: str = "row", columns: list[str] | None = None, column: str = "column"
) -> Panel:
    """A 2-d real tensor as an image with a colour bar; at most ``MAX_VALUE_ROWS`` x
    ``MAX_VALUE_COLS`` (a feature table: a row per request, a column per feature) with every
    value written in its cell. `row` and `column` name what a row and a column are (the axes);
    `columns` names each column (class labels) when there are at most ``MAX_VALUE_COLS``."""
    shape = tuple(x.shape)
    rows, cols = shape
    x, step = shrink(x, MAX_SIDE)
    values = x.float().cpu().numpy()
    notes = [f"every {step}th row and column"] if step > 1 else []
    data: dict[str, Any] = {"values": values, "shape": shape, "ylabel": row, "xlabel": column}
    if columns is not None and len(columns) == cols <= MAX_VALUE_COLS:
        data["columns"] = list(columns)
    if rows <= MAX_VALUE_ROWS and cols <= MAX_VALUE_COLS:
        integral = not x.is_floating_point()
        data["labels"] = [[str(int(v)) if integral else f"{v:.3g}" for v in line] for line in x.cpu().tolist()]
        size = (min(6.4, 2.2 + 0.55 * cols), min(4.8, 1.4 + 0.3 * rows))
    else:
        size = (4.8, 4.0)
    return Panel("heatmap", title, data, notes, size=size)


def encoded_images_panel(items: list[Any], ctx: Context, title: str) -> Panel:
    """Encoded images (bytes, as an image-to-image handler returns them) decoded and drawn as
    one grid; notes name the items that are no image, and a summary card says why when none is."""
    shown = items[: ctx.max_images]
    side = cell_side(len(shown))
    decoded, formats, failed = [], set(), []
    for i, data in enumerate(shown):
        image = decode_image(data, side)
        if isinstance(image, str):
            failed.append(f"[{i}]: {image}")
        else:
            decoded.append(image[0])
            formats.add(image[1])
    value = items[0] if len(items) == 1 else items
    if not decoded:
        reasons = [f.partition(": ")[2] for f in failed] if len(items) == 1 else failed[:3]
        why = reasons[0] if len(items) == 1 else "none of its items is an image (" + "; ".join(reasons) + ")"
        return summary_card(title, value, why)
    notes = [f"decoded from {'/'.join(sorted(formats))} bytes", *failed]
    if len(shown) < len(items):
        notes.insert(0, f"first {len(shown)} of {len(items)} images")
    return Panel("images", title, {"grid": grid(decoded)}, notes, size=(4.8, 4.4))


def decode_image(data: bytes | bytearray, side: int) -> tuple[torch.Tensor, str] | str:
    """The uint8 [3, H, W] picture of encoded image bytes, at most `side` pixels a side, and its
    format (``PNG``); or why it is none. Decoded as the handlers decode a request's image (PIL,
    its pixel limit checked from the header first)."""
    import numpy as np

    from handlerkit.errors import RequestError
    from handlerkit.handlers._decode import convert_mode, load_image, open_image

    try:
        image = open_image(data, 0)
    except RequestError as exc:
        if exc.error_code == 413:
            return "an image with more pixels than PIL's limit, left undecoded"
        return f"{len(data)} byte{'' if len(data) == 1 else 's'} that PIL cannot read as an image"
    try:
        image.draft("RGB", (side, side))  # JPEG: decoded at a reduced scale, much faster
        load_image(image, 0)
    except RequestError:
        return f"a {image.format} image that is corrupt or truncated"
    kind = str(image.format or "image")
    picture = convert_mode(image, "RGB")
    picture.thumbnail((side, side))
    return torch.from_numpy(np.array(picture, dtype=np.uint8)).permute(2, 0, 1), kind


def unit_images(x: torch.Tensor, view: HandlerView) -> tuple[torch.Tensor, str]:
    """[N, C, H, W] pixels as floats in [0, 1], de-normalised with the handler's mean and std
    when it has them, and a note saying how."""
    if x.dtype == torch.uint8:
        return x.float() / 255.0, "uint8 pixels"
    x = x.float()
    channels = x.shape[1]
    note = ""
    if view.mean and view.std and len(view.mean) in (1, channels) and len(view.std) in (1, channels):
        mean = torch.tensor(view.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(view.std, device=x.device).view(1, -1, 1, 1)
        x = x * std + mean
        note = f"de-normalised: mean={_fmt_list(view.mean)} std={_fmt_list(view.std)} ({view.normalize_at})"
    elif view.mean:
        note = f"not de-normalised: {view.normalize_at} normalises {len(view.mean)} channels, the image has {channels}"
    bounds = finite_range(x)
    x = torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0)
    scale = pixel_scale(x, bounds) if bounds is not None else 1.0
    if scale == 1.0:
        return x.clamp(0, 1), note or "values in [0, 1]"
    if scale == 255.0:
        return (x / 255.0).clamp(0, 1), (note + "; " if note else "") + "0-255 values scaled to [0, 1]"
    flat = x.flatten(1)
    low, high = flat.amin(1).view(-1, 1, 1, 1), flat.amax(1).view(-1, 1, 1, 1)
    why = "after de-normalising" if note.startswith("de-") else "no Normalize found on the handler" if not note else ""
    why = f" ({why})" if why else ""
    return ((x - low) / (high - low).clamp(min=1e-12)).clamp(0, 1), (note + "; " if note else "") + (
        f"each image rescaled to its own range{why}"
    )


def grid(images: list[torch.Tensor] | torch.Tensor, pad_value: float = 1.0) -> Any:
    """Images ([C, H, W] each, same dtype) as one [H, W, C] numpy grid, padded to one size."""
    from torchvision.utils import make_grid

    if isinstance(images, list):
        height = max(i.shape[-2] for i in images)
        width = max(i.shape[-1] for i in images)
        images = torch.stack(
            [torch.nn.functional.pad(i, (0, width - i.shape[-1], 0, height - i.shape[-2]), value=0) for i in images]
        )
    pad = pad_value if images.is_floating_point() else int(pad_value * 255)
    out = make_grid(images, nrow=columns(images.shape[0]), padding=2, pad_value=pad)
    return out.permute(1, 2, 0).cpu().numpy()


def pixel_scale(x: torch.Tensor, bounds: tuple[float, float]) -> float | None:
    """How `x`, whose finite values lie in `bounds`, holds pixels: 1.0 for values in [0, 1]
    (``ToTensor``'s; resizing overshoots a little), 255.0 for whole numbers in [0, 255] (8-bit
    pixels as floats); None when its values are no pixels' (a spectrogram, a feature map)."""
    low, high = bounds
    if low >= -0.1 and high <= 1.1:
        return 1.0
    if low >= 0 and high <= 255 and whole_numbers(x):
        return 255.0
    return None


def whole_numbers(x: torch.Tensor, probe: int = 4096) -> bool:
    """Whether the values of `x` are whole numbers (a strided sample of about `probe` values)."""
    flat = x.reshape(-1)
    sample = flat[:: max(1, flat.numel() // probe)]
    return bool((sample == sample.round()).all())


def _fmt_list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"
