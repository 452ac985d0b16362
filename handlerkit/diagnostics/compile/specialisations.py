"""Where a dynamic dimension was pinned to one size: the guard and the user's file:line.

Dynamo makes a dimension symbolic (``pt2: {compile: {dynamic: true}}``, ``mark_dynamic``, or
the recompile after a second size); a line such as ``if x.shape[0] == 4:`` or
``x.view(4, -1)`` then specialises it to a constant, and the compiled code serves that size
only: the next size recompiles. torch writes a ``symbolic_shape_specialization`` record to the
structured trace (``torch.__trace``) with the user's stack, its file names interned
(``torch._logging.structured.INTERN_TABLE``). :class:`~._dynamo_events.DynamoEvents` keeps
those records; :func:`specialisations` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handlerkit.diagnostics.compile.dynamo_events import dynamic_dims, user_frame, where

__all__ = ["Specialisation", "specialisations"]


@dataclass(frozen=True)
class Specialisation:
    """A symbolic dimension Dynamo specialised to a constant.

    Attributes:
        dimension: ``x: dim 0`` (or torch's source name when it is not an input's size).
        value: the size it was pinned to.
        guard: the guard that pinned it, ``s0 == 4 (range_refined_to_singleton)``: the symbol,
            the size, and how torch came to it.
        file / line / code: the user's line that made the guard.
    """

    dimension: str
    value: str
    guard: str
    file: str | None = None
    line: int | None = None
    code: str | None = None

    @property
    def where(self) -> str:
        return where(self.file, self.line)


def _file_names() -> dict[int, str]:
    try:
        from torch._logging import structured
    except ImportError:
        return {}
    return {number: name for name, number in getattr(structured, "INTERN_TABLE", {}).items()}


def _frame(frame: dict[str, Any], names: dict[int, str]) -> tuple[str, int, str | None]:
    """A structured-trace frame as ``(file, line, code)``, its interned file name resolved."""
    file = frame["filename"]
    name = names.get(file, str(file)) if isinstance(file, int) else str(file)
    return name, int(frame.get("line") or 0), frame.get("loc")


def specialisations(records: list[dict[str, Any]]) -> list[Specialisation]:
    """The specialisations in ``symbolic_shape_specialization`` records, once each."""
    names = _file_names()
    found: dict[Specialisation, None] = {}
    for record in records:
        sources = [s for s in record.get("sources") or () if isinstance(s, str)]
        dimension = ", ".join(dynamic_dims(sources) or sources) or str(record.get("symbol"))
        stack = [_frame(f, names) for f in record.get("user_stack") or () if isinstance(f, dict) and "filename" in f]
        frame = user_frame(stack)
        file, line, code = frame if frame else (None, None, None)
        guard = f"{record.get('symbol')} == {record.get('value')}"
        if record.get("reason"):
            guard += f" ({record['reason']})"  # how torch came to it: range_refined_to_singleton ...
        spec = Specialisation(dimension, str(record.get("value")), guard, file, line, code)
        found[spec] = None
    return list(found)
