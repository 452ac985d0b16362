"""Short descriptions of the values that flow between stages: where their tensors live,
and a one-phrase type/shape for tables. Never imports torch itself: a value can hold a
tensor only once torch is imported."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["TensorInfo", "describe", "iter_tensors", "tensor_head", "tensor_infos"]


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
    ``list[2] of dict(3 keys)`` (four levels deep at most)."""
    first = next(iter_tensors(value, limit=1), None)
    if first is not None and first[0] == "<value>":
        return tensor_head(first[1])
    if isinstance(value, (list, tuple)):
        inner = (describe(value[0], _depth + 1) if _depth < 4 else "...") if value else ""
        return f"{type(value).__name__}[{len(value)}]" + (f" of {inner}" if inner else "")
    if isinstance(value, dict):
        return f"dict({len(value)} keys)"
    if value is None:
        return "None"
    return type(value).__name__
