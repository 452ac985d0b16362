"""Outputs compared with a numeric tolerance: what batch parity and golden files call "the same".

One rule for both (``Harness.check``'s batch parity and encodings, ``assert_matches_golden``):

* numbers are the same within ``atol + rtol * |expected|``; equal infinities are the same, and
  NaN is the same as NaN only;
* a ``bool`` is not a number here: ``True`` is not ``1``;
* dicts have the same keys (in any order) and the same values; lists and tuples the same
  length and the same items;
* tensors and arrays have the same shape and values within the tolerance (NaN as above);
* anything else is equal (``==``) and of the same type.

Importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Difference", "differences", "same_output", "shown"]


@dataclass(frozen=True)
class Difference:
    """One place where an output differs from the expected one.

    Attributes:
        path: where, as indexing from the output: ``"[0]['cat']"``; ``""`` is the whole output.
        kind: ``"number"`` (beyond the tolerance), ``"value"`` (another value or type),
            ``"length"`` (lists of other lengths), ``"missing keys"`` or ``"new keys"`` (dicts).
        expected / actual: the two values at ``path``.
        keys: the missing or new keys.
    """

    path: str
    kind: str
    expected: Any
    actual: Any
    keys: tuple[Any, ...] = ()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same_number(expected: float, actual: float, atol: float, rtol: float) -> bool:
    if expected == actual:
        return True  # equal infinities too
    if math.isnan(expected) or math.isnan(actual):
        return math.isnan(expected) and math.isnan(actual)
    if math.isinf(expected) or math.isinf(actual):
        return False  # an infinite tolerance would take any number
    return abs(actual - expected) <= atol + rtol * abs(expected)


def _same_tensor(expected: Any, actual: Any, atol: float, rtol: float) -> bool:
    import torch

    expected, actual = torch.as_tensor(expected), torch.as_tensor(actual)
    if expected.shape != actual.shape:
        return False
    return bool(torch.allclose(actual.float().cpu(), expected.float().cpu(), atol=atol, rtol=rtol, equal_nan=True))


def differences(
    expected: Any, actual: Any, atol: float = 1e-4, rtol: float = 1e-4, path: str = ""
) -> Iterator[Difference]:
    """Each place where ``actual`` differs from ``expected``, outermost first (the module docstring's rule)."""
    if _number(expected) and _number(actual):
        if not _same_number(expected, actual, atol, rtol):
            yield Difference(path, "number", expected, actual)
    elif isinstance(expected, dict) and isinstance(actual, dict):
        missing = tuple(k for k in expected if k not in actual)
        new = tuple(k for k in actual if k not in expected)
        if missing:
            yield Difference(path, "missing keys", expected, actual, missing)
        if new:
            yield Difference(path, "new keys", expected, actual, new)
        for key in expected:
            if key in actual:
                yield from differences(expected[key], actual[key], atol, rtol, f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            yield Difference(path, "length", expected, actual)
        for i, (e, a) in enumerate(zip(expected, actual)):
            yield from differences(e, a, atol, rtol, f"{path}[{i}]")
    elif hasattr(expected, "shape") and hasattr(actual, "shape"):
        if not _same_tensor(expected, actual, atol, rtol):
            yield Difference(path, "value", expected, actual)
    elif type(expected) is not type(actual) or expected != actual:
        yield Difference(path, "value", expected, actual)


def same_output(actual: Any, expected: Any, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
    """Whether ``actual`` is the same as ``expected`` (the tolerance is relative to ``expected``)."""
    return next(differences(expected, actual, atol, rtol), None) is None


def shown(value: Any, n: int = 60) -> str:
    """``repr(value)`` cut to ``n`` characters, for a message about a difference."""
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."
