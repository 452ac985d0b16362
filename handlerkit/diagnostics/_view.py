"""What diagnostics may use of a harness: its public surface, typed.

Diagnostics sit above the harness (layer 5 over layer 4) and read it only through these
members; a test double that has them works as well as :class:`handlerkit.harness.Harness`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from handlerkit.results import Run, StageResult

__all__ = ["HarnessView"]


class HarnessView(Protocol):
    """The members of a harness the diagnostics read or call."""

    context: Any
    handler: Any
    results: dict[str, StageResult]
    batch: Any
    track_memory: bool

    @property
    def name(self) -> str: ...

    @property
    def single_stage(self) -> bool: ...

    @property
    def entry(self) -> Callable[[Any, Any], Any]: ...

    def initialize(self) -> StageResult: ...

    def run(self, batch_or_data: Any) -> Run: ...

    def imports(self) -> AbstractContextManager[Any]: ...

    def preserved(self) -> AbstractContextManager[None]: ...
