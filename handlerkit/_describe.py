"""Short descriptions of the values that flow between stages: where their tensors live,
and a one-phrase type/shape for tables. Never imports torch itself: a value can hold a
tensor only once torch is imported."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["TensorInfo", "describe", "tensor_infos"]


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a stage's input or output lives."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    device: str


def tensor_infos(value: Any, path: str = "", limit: int = 64) -> list[TensorInfo]:
    """The tensors inside a (nested) value, by path: ``[0]["boxes"]`` ..."""
    if "torch" not in sys.modules:
        return []
    import torch

    found: list[TensorInfo] = []

    def walk(v: Any, p: str, depth: int) -> None:
        if len(found) >= limit or depth > 6:
            return
        if isinstance(v, torch.Tensor):
            found.append(TensorInfo(p or "<value>", tuple(v.shape), str(v.dtype).replace("torch.", ""), str(v.device)))
        elif isinstance(v, dict):
            for k, item in v.items():
                walk(item, f"{p}[{k!r}]", depth + 1)
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v[:limit]):
                walk(item, f"{p}[{i}]", depth + 1)

    walk(value, path, 0)
    return found


def describe(value: Any) -> str:
    """A short type/shape description of a stage value: ``Tensor[2, 3] float32 cpu``,
    ``list[2] of dict(3 keys)``."""
    infos = tensor_infos(value, limit=2)
    if infos and infos[0].path == "<value>":
        i = infos[0]
        return f"Tensor{list(i.shape)} {i.dtype} {i.device}"
    if isinstance(value, (list, tuple)):
        inner = describe(value[0]) if value else ""
        return f"{type(value).__name__}[{len(value)}]" + (f" of {inner}" if inner else "")
    if isinstance(value, dict):
        return f"dict({len(value)} keys)"
    if value is None:
        return "None"
    return type(value).__name__
