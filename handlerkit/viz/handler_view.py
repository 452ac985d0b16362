"""What a picture needs to know about the handler: its normalisation, labels and vocabulary.

Pictures read them from the handler that produced a result (``StageResult.source``,
``Run.source``; :func:`view_for` picks it), so the user passes nothing: the mean and std of a
torchvision ``Normalize`` inside the handler's transforms (TorchServe's vision handlers keep
them in ``image_processing``), the index→label ``mapping`` (``index_to_name.json``), and a
vocabulary (``vocab``, ``source_vocab`` as in TorchServe's text handlers, or a Hugging Face
``tokenizer``).
Attributes are read statically (``inspect.getattr_static``), so no property runs.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from handlerkit.recording.results import Run, StageResult

__all__ = ["HandlerView", "read_handler", "view_for"]

# Where handlers keep their transforms, most common first; other attributes are searched after.
_TRANSFORM_NAMES = (
    "image_processing",
    "transform",
    "transforms",
    "preprocess_transform",
    "image_transform",
    "preprocessing",
    "val_transform",
    "test_transform",
)
_MAPPING_NAMES = ("mapping", "index_to_name", "idx_to_class", "labels", "classes", "class_names")
_VOCAB_NAMES = ("vocab", "source_vocab", "vocabulary", "tokenizer", "itos")
_BACKGROUND = {"background", "__background__", "bg", "_background_", "void"}


@dataclass
class HandlerView:
    """The handler's facts a picture uses; every field may be missing (None)."""

    mean: list[float] | None = None
    std: list[float] | None = None
    normalize_at: str | None = None  # "handler.image_processing", for the picture's note
    mapping: dict[str, str] | None = None
    mapping_at: str | None = None
    lookup: Callable[[list[int]], list[str]] | None = None
    vocab_at: str | None = None

    def label(self, index: int) -> str:
        """The class name of `index` (the index itself when unknown)."""
        if self.mapping is not None:
            return self.mapping.get(str(index), str(index))
        return str(index)

    def is_background(self, index: int) -> bool:
        """Class 0 without a mapping, or a class the mapping calls background."""
        if self.mapping is None:
            return index == 0
        return self.label(index).strip().lower() in _BACKGROUND

    def tokens(self, ids: list[int]) -> list[str] | None:
        """The vocabulary entries of `ids` (``<id?>`` for an id outside it), or None without one."""
        if self.lookup is None:
            return None
        try:
            return [str(t) for t in self.lookup(ids)]
        except Exception:  # a tokenizer that refuses one id: look them up one by one
            out = []
            for i in ids:
                try:
                    out.append(str(self.lookup([i])[0]))
                except Exception:
                    out.append(f"<{i}?>")
            return out


def _static(obj: Any, name: str) -> Any:
    try:
        value = inspect.getattr_static(obj, name)
    except AttributeError:
        return None
    if isinstance(value, types.MemberDescriptorType):  # a __slots__ attribute: read its value
        return getattr(obj, name, None)
    return None if isinstance(value, (property, staticmethod, classmethod)) or inspect.isfunction(value) else value


def _attributes(obj: Any, preferred: Sequence[str]) -> list[tuple[str, Any]]:
    """``(name, value)``: the preferred names first, then the instance's and its classes' other
    attributes (for transforms kept under another name)."""
    seen: set[str] = set()
    out = []
    names = list(preferred)
    names += [n for n in getattr(obj, "__dict__", {}) if not n.startswith("__")]
    for cls in type(obj).__mro__[:-1] if not isinstance(obj, type) else ():
        names += [n for n in vars(cls) if not n.startswith("__")]
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        value = _static(obj, name)
        if value is not None:
            out.append((name, value))
    return out


def _floats(value: Any) -> list[float] | None:
    try:
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, (int, float)):
            return [float(value)]
        return [float(v) for v in value]
    except (TypeError, ValueError):
        return None


def _find_normalize(
    value: Any, budget: list[int] | None = None, depth: int = 0
) -> tuple[list[float], list[float]] | None:
    """The mean and std of the first ``Normalize`` inside a transform pipeline (a bounded walk:
    an attribute may be a whole model)."""
    budget = [300] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0 or depth > 5 or value is None or isinstance(value, (str, bytes, int, float, dict)):
        return None
    if "Normalize" in type(value).__name__ and hasattr(value, "mean") and hasattr(value, "std"):
        mean, std = _floats(value.mean), _floats(value.std)
        if mean and std and all(s != 0 for s in std):
            return mean, std
    children: list[Any] = []
    if isinstance(value, (list, tuple)):
        children = list(value[:64])
    else:
        inner = getattr(value, "transforms", None)  # torchvision Compose (v1 and v2), RandomApply
        if isinstance(inner, (list, tuple)):
            children = list(inner)
        elif hasattr(value, "children") and callable(value.children):  # nn.Sequential of v2 transforms
            try:
                children = list(value.children())[:64]
            except Exception:
                children = []
    for child in children:
        found = _find_normalize(child, budget, depth + 1)
        if found:
            return found
    return None


def _mapping(value: Any) -> dict[str, str] | None:
    """An index→label dict from a mapping-like attribute: a dict or a list of labels."""
    if isinstance(value, dict) and value:
        out = {}
        for key, label in value.items():
            if isinstance(label, (list, tuple)) and label:
                label = label[-1]  # TorchServe's ["n01440764", "tench"]
            if not isinstance(label, str) or not str(key).lstrip("-").isdigit():
                return None
            out[str(key)] = label
        return out
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return {str(i): v for i, v in enumerate(value)}
    return None


def _lookup(value: Any) -> Callable[[list[int]], list[str]] | None:
    """A function ids → tokens for a tokenizer, torchtext vocab, list or dict."""
    if hasattr(value, "convert_ids_to_tokens"):  # Hugging Face tokenizers
        return lambda ids: list(value.convert_ids_to_tokens(ids))
    if hasattr(value, "lookup_tokens"):  # torchtext Vocab
        return lambda ids: list(value.lookup_tokens(ids))
    if hasattr(value, "get_itos"):
        return _lookup(list(value.get_itos()))
    if isinstance(getattr(value, "itos", None), list):  # handlerkit's Vocabulary, torchtext's legacy Vocab
        return _lookup(value.itos)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value[:100]):
        table = list(value)
        return lambda ids: [table[i] if 0 <= i < len(table) else f"<{i}?>" for i in ids]
    if isinstance(value, dict) and value:
        sample = list(value.items())[:100]
        if all(isinstance(k, str) and isinstance(v, int) for k, v in sample):  # token → id
            inverse = {v: k for k, v in value.items()}
        elif all(isinstance(k, int) and isinstance(v, str) for k, v in sample):  # id → token
            inverse = dict(value)
        else:
            return None
        return lambda ids: [inverse.get(i, f"<{i}?>") for i in ids]
    return None


def read_handler(handler: Any) -> HandlerView:
    """What the pictures of `handler`'s results can use (empty for None or a function)."""
    view = HandlerView()
    if handler is None:
        return view
    for name, value in _attributes(handler, _TRANSFORM_NAMES):
        if name in _MAPPING_NAMES or name in _VOCAB_NAMES:
            continue
        found = _find_normalize(value)
        if found:
            view.mean, view.std = found
            view.normalize_at = f"handler.{name}"
            break
    for name in _MAPPING_NAMES:
        mapping = _mapping(_static(handler, name))
        if mapping:
            view.mapping, view.mapping_at = mapping, f"handler.{name}"
            break
    for name in _VOCAB_NAMES:
        lookup = _lookup(_static(handler, name))
        if lookup is not None:
            view.lookup, view.vocab_at = lookup, f"handler.{name}"
            break
    return view


def view_for(obj: Any, handler: Any = None) -> HandlerView:
    """What the pictures of `obj` can use: from `handler` when given (a Harness stands for its
    handler), else from the handler that produced `obj` (a StageResult's or Run's ``source``)."""
    if handler is None:
        handler = getattr(obj, "source", None) if isinstance(obj, (StageResult, Run)) else None
    if hasattr(handler, "handler") and hasattr(handler, "results"):  # a Harness: its handler
        handler = handler.handler
    return read_handler(handler)
