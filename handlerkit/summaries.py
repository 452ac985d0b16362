"""One-line descriptions of the values that flow between stages, for tables, reprs and errors.

- :func:`describe`: type and shape in a phrase, cheap enough for every table row:
  ``Tensor[2, 3] float32 cpu``, ``list[2] of dict(3 keys)``;
- :func:`summary`: a ``lovely-tensors``-style line with statistics, for every tensor we print:
  ``Tensor[2, 3, 224, 224] float32 cpu n=301056 (1.1 MiB) min=-2.118 max=2.64 mean=-0.4121
  std=1.003`` plus ``NaN=`` / ``+Inf=`` / ``-Inf=`` counts and ``all zeros`` when they apply;
  for a list or dict, one line per tensor under its path;
- :func:`iter_tensors` / :func:`tensor_infos`: where the tensors inside a value are
  (``[0]["boxes"]``, ``.scores``) and where they live.

The statistics' reductions run where the tensor lives and only a handful of scalars come back,
in one transfer (one synchronisation on an accelerator): a GPU tensor is never copied to the
host. Tensors without values (``meta``, the fake tensors of compile tracing) give shape, dtype
and device only; any other tensor whose statistics cannot be computed says why instead of
raising. Statistics are computed only when something is rendered, never on the harness's hot
path. Nothing here imports torch: a value can hold a tensor only once torch is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from handlerkit._text import format_bytes

__all__ = [
    "TensorInfo",
    "describe",
    "dtype_name",
    "iter_tensors",
    "no_values",
    "summary",
    "tensor_head",
    "tensor_infos",
    "tensor_summary",
]


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a stage's input or output lives."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    device: str


def iter_tensors(value: Any, path: str = "", limit: int = 64) -> Iterator[tuple[str, Any]]:
    """``(path, tensor)`` for the tensors inside a (nested) value: ``[0]["boxes"]``, ``.scores``
    (a NamedTuple's field) ...; a bare tensor's path is ``"<value>"``. At most ``limit`` tensors, six levels deep."""
    if "torch" not in sys.modules:
        return
    import torch

    found = 0

    def walk(v: Any, p: str, depth: int) -> Iterator[tuple[str, Any]]:
        nonlocal found
        if found >= limit or depth > 6:
            return
        if isinstance(v, torch.Tensor):
            found += 1
            yield p or "<value>", v
        elif isinstance(v, dict):
            for k, item in v.items():
                yield from walk(item, f"{p}[{k!r}]", depth + 1)
        elif isinstance(v, (list, tuple)):
            names = getattr(v, "_fields", None)  # a NamedTuple: by field name
            for i, item in enumerate(v[:limit]):
                yield from walk(item, f"{p}.{names[i]}" if names else f"{p}[{i}]", depth + 1)

    yield from walk(value, path, 0)


def dtype_name(dtype: Any) -> str:
    """``torch.float32`` → ``"float32"``."""
    return str(dtype).replace("torch.", "")


def tensor_head(t: Any) -> str:
    """``Tensor[2, 3] float32 cpu``: the start of every line that names a tensor."""
    if t.is_nested:  # a nested tensor has no single shape
        return f"NestedTensor[{t.size(0)} tensors] {dtype_name(t.dtype)} {t.device}"
    return f"Tensor{list(t.shape)} {dtype_name(t.dtype)} {t.device}"


def tensor_infos(value: Any, path: str = "", limit: int = 64) -> list[TensorInfo]:
    """The tensors inside a (nested) value, by path: ``[0]["boxes"]`` ..."""
    return [
        TensorInfo(p, () if t.is_nested else tuple(t.shape), dtype_name(t.dtype), str(t.device))
        for p, t in iter_tensors(value, path, limit)
    ]


def describe(value: Any, _depth: int = 0) -> str:
    """A short type/shape description of a stage value: ``Tensor[2, 3] float32 cpu``,
    ``list[2] of dict(3 keys)``, ``list[3] of list[4|2|7] of dict(2 keys)`` (ragged lists give
    their items' lengths; four levels deep at most)."""
    first = next(iter_tensors(value, limit=1), None)
    if first is not None and first[0] == "<value>":
        return tensor_head(first[1])
    if isinstance(value, (list, tuple)):
        inner = (describe(value[0], _depth + 1) if _depth < 4 else "...") if value else ""
        ragged = _ragged(value)
        if ragged and inner:  # the items' lengths, not only the first's: list[4|2|7] of dict
            inner = f"{type(value[0]).__name__}[{ragged}]" + inner.partition("]")[2]
        return f"{type(value).__name__}[{len(value)}]" + (f" of {inner}" if inner else "")
    if isinstance(value, dict):
        return f"dict({len(value)} keys)"
    if value is None:
        return "None"
    return type(value).__name__


def _ragged(value: Any) -> str:
    """The lengths of a list's items when they are lists (or tuples) of different lengths:
    ``4|2|7`` for up to six items, ``2..7`` (the shortest and longest) for more; else ``""``."""
    first = type(value[0]) if value else None
    if first not in (list, tuple) or not all(type(v) is first for v in value[:4096]):
        return ""
    lengths = [len(v) for v in value[:4096]]
    if len(set(lengths)) == 1:
        return ""
    return "|".join(map(str, lengths)) if len(lengths) <= 6 else f"{min(lengths)}..{max(lengths)}"


def summary(value: Any, *, limit: int = 32) -> str:
    """A one-line summary of a tensor, or of each tensor in a (nested) list / tuple / dict.

    Args:
        value: a tensor, or a value holding tensors (``[{"boxes": t, ...}]``), or anything.
        limit: the most tensor lines for a nested value.

    Returns:
        For a tensor, one line. For a nested value, its description followed by one indented
        line per tensor, ``  [0]['boxes']: Tensor[3, 4] float32 cpu ...``. For a value without
        tensors, its short description (``list[2] of str``).
    """
    if _is_tensor(value):
        return tensor_summary(value)
    found = list(iter_tensors(value, limit=limit + 1))
    lines = [describe(value)]
    lines += [f"  {path}: {tensor_summary(t)}" for path, t in found[:limit]]
    if len(found) > limit:
        lines.append(f"  ... more tensors than the {limit} shown")
    return "\n".join(lines)


def _is_tensor(value: Any) -> bool:
    return "torch" in sys.modules and isinstance(value, sys.modules["torch"].Tensor)


def tensor_summary(t: Any) -> str:
    """The one-line summary of one tensor (see the module docstring)."""
    import torch

    parts = [tensor_head(t)]
    if t.requires_grad:
        parts.append("grad")
    missing = no_values(t)
    if missing:
        return " ".join(parts) + f" ({missing})"
    if t.is_nested:
        return " ".join(parts) + " (nested tensor: no statistics)"
    if t.layout != torch.strided:
        return " ".join(parts + _sparse(t))
    parts.append(f"n={t.numel()} ({format_bytes(t.numel() * t.element_size())})")
    if t.is_quantized and t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        parts.append(f"scale={t.q_scale():.4g} zero_point={t.q_zero_point()}")
    if t.numel() == 0:
        return " ".join(parts + ["empty"])
    try:
        parts += _statistics(t)
    except Exception as exc:  # a tensor the host cannot read, out of memory, an odd subclass
        first_line = (str(exc).splitlines() or [""])[0][:80]
        parts.append(f"(no statistics: {type(exc).__name__}: {first_line})")
    return " ".join(parts)


def no_values(t: Any) -> str | None:
    """Why `t` has no values to reduce, or None when it has them."""
    import torch

    if t.is_meta:
        return "meta tensor: no values"
    fake: Any
    try:
        from torch._subclasses.fake_tensor import FakeTensor as fake
    except ImportError:  # pragma: no cover - the private path moved
        fake = ()
    if isinstance(t, fake):
        return "fake tensor (compile tracing): no values"
    compiling = getattr(torch.compiler, "is_compiling", None)
    if compiling is not None and compiling():
        return "inside torch.compile tracing: no values"
    return None


def _sparse(t: Any) -> list[str]:
    """Layout, stored count and the stored values' statistics of a sparse tensor."""
    import torch

    layout = str(t.layout).replace("torch.", "")
    values = t._values() if t.layout == torch.sparse_coo else t.values()
    parts = [layout, f"nnz={values.numel()}"]
    if values.numel():
        try:
            parts += ["stored:"] + _statistics(values.detach())
        except Exception as exc:
            parts.append(f"(no statistics: {type(exc).__name__})")
    return parts


def _num(value: float, integral: bool = False) -> str:
    if integral and value == value and abs(value) != float("inf"):
        return str(int(value))
    return f"{value:.4g}"


def _statistics(t: Any) -> list[str]:
    """min / max / mean / std, non-finite counts and "all zeros", fetched in one device→host copy
    (a second, small one only when there are NaN/Inf values, or for an integer's exact range)."""
    import torch

    with torch.no_grad():
        x = t.detach()
        if x.is_quantized:
            x = x.dequantize()
        if x.dim() == 0:
            value = x.item()
            return [f"value={_num(value, isinstance(value, int)) if isinstance(value, (int, float)) else value}"]
        n = x.numel()
        if x.dtype == torch.bool:
            true = int(x.sum().item())
            return ["all False"] if true == 0 else [f"true={true} ({100.0 * true / n:.3g}%)"]
        prefix = ""
        if x.is_complex():
            x, prefix = x.abs(), "|x| "
        integral = not x.is_floating_point()
        # MPS has no float64; elsewhere the scalars travel (and integer statistics run) in float64.
        acc = torch.float32 if x.device.type == "mps" else torch.float64
        xf = x.to(acc) if integral else (x if x.dtype in (torch.float32, torch.float64) else x.float())
        low, high = torch.aminmax(xf)
        std, mean = torch.std_mean(xf, correction=1 if n > 1 else 0)
        scalars = (
            torch.stack(
                [
                    v.to(acc)
                    for v in (
                        torch.isfinite(xf).sum(),
                        torch.isnan(xf).sum(),
                        (xf == float("inf")).sum(),
                        torch.count_nonzero(xf),
                        low,
                        high,
                        mean,
                        std,
                    )
                ]
            )
            .cpu()
            .tolist()
        )
        n_finite, nan, pos, nonzero = (int(v) for v in scalars[:4])
        low_v, high_v, mean_v, std_v = scalars[4:]
        if n_finite < n and n_finite:  # rare: the statistics of the finite values only
            finite = xf[torch.isfinite(xf)]
            low, high = torch.aminmax(finite)
            std, mean = torch.std_mean(finite, correction=1 if n_finite > 1 else 0)
            low_v, high_v, mean_v, std_v = torch.stack([low, high, mean, std]).to(acc).cpu().tolist()
        if integral and acc == torch.float64 and max(abs(low_v), abs(high_v)) >= 2**53:
            low_v, high_v = torch.stack(torch.aminmax(x)).cpu().tolist()  # exact beyond float64's 53 bits
    parts: list[str] = []
    if n_finite:
        parts.append(f"{prefix}min={_num(low_v, integral)} max={_num(high_v, integral)} mean={mean_v:.4g}")
        if n_finite > 1:
            parts.append(f"std={std_v:.4g}")
    else:
        parts.append("no finite values")
    neg = n - n_finite - nan - pos
    parts += [f"{name}={count}" for name, count in (("NaN", nan), ("+Inf", pos), ("-Inf", neg)) if count]
    if nonzero == 0:
        parts.append("all zeros")
    return parts
