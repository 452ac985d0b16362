"""What a handler says while it runs: warnings and log records, caught per run, sliced per stage.

A :class:`Capture` is opened once around a run (every stage of one batch) or a single step.
Each stage only notes where its slice of :attr:`Capture.warnings` and :attr:`Capture.logs`
starts and ends. It is a class with slots rather than stacked ``with`` blocks because the
harness pays for it on every run (see ``benchmarks/harness_overhead.py``).
"""

from __future__ import annotations

import logging
import warnings
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
    """Warnings and log records caught while it is open; ``imports`` (a context manager, the
    model dir's imports) is open meanwhile.

    Caught warnings are shown as usual when it closes, once per place for a given
    ``registry`` (a ``__warningregistry__``-like dict the owner keeps).

    Args:
        imports: entered first, left last.
        log_handler: a :class:`ListHandler` to add to the root logger, or None to leave logs alone.
        registry: the warnings registry for showing caught warnings again.
    """

    __slots__ = ("_catcher", "_imports", "_log_handler", "_registry", "logs", "warnings")

    def __init__(self, imports: Any, log_handler: ListHandler | None, registry: dict[Any, Any]) -> None:
        self._imports = imports
        self._log_handler = log_handler
        self._registry = registry
        self.warnings: list[warnings.WarningMessage] = []
        self.logs: list[LogEntry] = []

    def __enter__(self) -> Capture:
        self._imports.__enter__()
        try:
            self._catcher = warnings.catch_warnings(record=True)
            self.warnings = self._catcher.__enter__()
            # Record every warning: simplefilter("always") on the filter list catch_warnings
            # restores on exit, set in one step (simplefilter raises and catches a ValueError
            # each time, and every change of the filters makes warnings re-read them).
            warnings.filters = list(_RECORD_ALL)  # catch_warnings puts the caller's list back
            if self._log_handler is not None:
                # Only a handler is added: Logger.setLevel would clear the cache of every logger
                # (hundreds once torch is imported), ~0.3 ms each time.
                self._log_handler.entries = self.logs
                logging.root.addHandler(self._log_handler)
        except BaseException:
            self._imports.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._log_handler is not None:
                logging.root.removeHandler(self._log_handler)
                self._log_handler.entries = []
            self._catcher.__exit__(None, None, None)
        finally:
            self._imports.__exit__(None, None, None)
        for w in self.warnings:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=self._registry)
