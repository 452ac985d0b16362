"""What diagnostics may use of a harness: its public surface, typed.

Diagnostics sit below the :class:`~handlerkit.harness.Harness` (it calls down into them) and
reach it only through these members; a test double that has them works as well.

What they read: ``name``, ``context`` (statuses, the model config), ``handler`` (its decisions,
device and model), ``results`` (the stages run so far), ``single_stage``.

What they change, and put back: every diagnostic that runs batches does so inside
:func:`handlerkit.diagnostics.runs.diagnostic_runs`, which calls ``initialize()`` when the last
one did not succeed (its result stays: it is the user's initialize), sets ``track_memory`` off
and back, and runs inside ``preserved()``, so the ``results`` and ``batch`` that ``run()``
replaces are put back after. The handler itself is touched by two reports, each putting it
back: ``compile_report`` swaps ``handler.model`` for its eager model while timing that (and
leaves the eager model in place when the compiled one fails at its first call, as handlerkit's
BaseHandler does), and ``profile`` shadows the stage methods with instance attributes for one
run. ``device_report`` calls ``handler.inference`` once more under ``imports()``, outside the
harness's results. ``check`` seeds the random generators for its runs and puts their states back.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from handlerkit.errors import HandlerkitError
from handlerkit.recording.results import Run, StageResult

__all__ = ["HarnessView", "model_handler"]


class HarnessView(Protocol):
    """The members of a harness the diagnostics read, call or (and put back) change."""

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


def model_handler(view: HarnessView, report: str) -> Any:
    """The view's handler, which ``report`` reads the model of (``handler.model``); a function
    handler has none, and is refused with the fix."""
    if view.handler is None:
        raise HandlerkitError(
            f"{view.name} is a function handler: {report} finds the model as handler.model",
            fix="write the handler as a class (e.g. a BaseHandler subclass) that keeps its model in self.model",
        )
    return view.handler
