"""How a diagnostic runs extra batches on a harness and leaves it as it found it.

Every diagnostic that runs batches of its own (``timing``, ``profile``, ``compile``, ``checks``)
does so inside :func:`diagnostic_runs`::

    with diagnostic_runs(view):
        run = view.run(batch)       # as many runs as the diagnostic needs

On entry the handler is initialized when it has not been (or when its last initialize failed):
that initialize is the user's, so its result stays. Inside, per-stage memory tracking is off (a
diagnostic measures the handler, not the memory tracker). On exit, whatever happened, the
harness's results and bound batch are put back (``view.preserved()``), and memory tracking is
as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from handlerkit.diagnostics._view import HarnessView

__all__ = ["diagnostic_runs", "ensure_initialized"]


def ensure_initialized(view: HarnessView) -> None:
    """Initialize the handler unless its last initialize succeeded.

    Raises:
        StageError: initialize failed.
    """
    result = view.results.get("initialize")
    if result is None or not result.ok:
        view.initialize()


@contextlib.contextmanager
def diagnostic_runs(view: HarnessView) -> Iterator[None]:
    """Runs for a diagnostic: initialized first, memory tracking off, the harness put back after."""
    ensure_initialized(view)
    track_memory, view.track_memory = view.track_memory, False
    try:
        with view.preserved():
            yield
    finally:
        view.track_memory = track_memory
