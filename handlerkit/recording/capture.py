"""What a handler says while it runs: warnings and log records, caught per run, sliced per stage.

A :class:`Capture` is opened around a run (every stage of one batch) or a single step; a step
inside a run (``initialize``) is caught by the run's.
Each stage only notes where its slice of :attr:`Capture.warnings` and :attr:`Capture.logs`
starts and ends. It is a class with slots rather than stacked ``with`` blocks because the
harness pays for it on every run (see ``benchmarks/harness_overhead.py``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

from handlerkit.recording.results import LogEntry

__all__ = ["Capture", "ListHandler", "enable_info_logs"]

_RECORD_ALL = [("always", None, Warning, None, 0)]


class ListHandler(logging.Handler):
    """A logging handler that keeps records as :class:`LogEntry` in ``entries``.

    One per harness: building a ``logging.Handler`` costs locks and weakref registration.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[LogEntry] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string in someone's log call must not break the stage
            message = str(record.msg)
        self.entries.append(LogEntry(record.levelname, record.name, message))


def enable_info_logs() -> None:
    """TorchServe's worker configures logging at INFO, so handlers' ``logger.info`` calls are
    seen; do the same (once) so they can be recorded. Nothing is printed: no handler is added,
    and Python's last-resort handler shows WARNING and above only."""
    root = logging.getLogger()
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


class Capture:
    """Warnings and log records caught while it is open; the model dir's imports (the context
    manager ``running()`` returns) are open meanwhile.

    One per harness, entered with ``with`` around every run and every step: entering it again
    while it is open (a step inside a run, ``initialize`` run by ``h.run``) only counts, so the
    outermost block catches everything and the inner ones see the same lists. Each time it
    opens, :attr:`warnings` and :attr:`logs` start empty (results keep slices of them).

    Caught warnings are shown as usual when it closes, once per place for a given
    ``registry`` (a ``__warningregistry__``-like dict the owner keeps).

    Args:
        running: returns the context manager entered first and left last each time it opens
            (:meth:`Service.running <handlerkit.service.Service.running>`).
        log_handler: a :class:`ListHandler` to add to the root logger, or None to leave logs
            alone (:attr:`log_handler`, read as it opens).
        registry: the warnings registry for showing caught warnings again.
        look: called as it opens, before anything is caught, while :attr:`looking` (the
            harness's "handler.py changed since it was loaded" warning: a stat per file).
    """

    __slots__ = (
        "_added",
        "_catcher",
        "_depth",
        "_imports",
        "_look",
        "_registry",
        "_running",
        "log_handler",
        "logs",
        "looking",
        "warnings",
    )

    def __init__(
        self,
        running: Callable[[], Any],
        log_handler: ListHandler | None,
        registry: dict[Any, Any],
        look: Callable[[], None] | None = None,
    ) -> None:
        self._running = running
        self._imports: Any = None
        self._added: ListHandler | None = None  # the log handler added as it opened
        self.log_handler = log_handler
        self._registry = registry
        self._look = look
        self._depth = 0
        #: Whether opening calls ``look`` (a diagnostic's loop of runs looks once, before it).
        self.looking = look is not None
        self.warnings: list[warnings.WarningMessage] = []
        self.logs: list[LogEntry] = []

    @property
    def open(self) -> bool:
        """Whether a block is open (a step is then part of an enclosing run)."""
        return self._depth > 0

    def __enter__(self) -> Capture:
        if self._depth:
            self._depth += 1
            return self
        if self.looking and self._look is not None:
            self._look()  # outside the catch: the warning is the user's to see now
        imports = self._imports = self._running()
        imports.__enter__()
        try:
            self._catcher = warnings.catch_warnings(record=True)
            self.warnings = self._catcher.__enter__()
            # Record every warning: simplefilter("always") on the filter list catch_warnings
            # restores on exit, set in one step (simplefilter raises and catches a ValueError
            # each time, and every change of the filters makes warnings re-read them).
            warnings.filters = list(_RECORD_ALL)  # catch_warnings puts the caller's list back
            self.logs = []
            added = self._added = self.log_handler
            if added is not None:
                # Only a handler is added: Logger.setLevel would clear the cache of every logger
                # (hundreds once torch is imported), ~0.3 ms each time.
                added.entries = self.logs
                logging.root.addHandler(added)
        except BaseException:
            imports.__exit__(None, None, None)
            raise
        self._depth = 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._depth -= 1
        if self._depth:
            return
        try:
            added = self._added
            if added is not None:
                logging.root.removeHandler(added)
                added.entries = []
            self._catcher.__exit__(None, None, None)
        finally:
            self._imports.__exit__(None, None, None)
        for w in self.warnings:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=self._registry)
