"""What a handler says while it runs (:mod:`handlerkit.recording.capture`): warnings and log
records caught while a :class:`Capture` is open, shown again once it closes."""

from __future__ import annotations

import contextlib
import logging
import warnings

import pytest

from handlerkit.recording.capture import Capture, ListHandler, enable_info_logs
from handlerkit.recording.results import LogEntry


class Imports:
    """A stand-in for the model dir's imports: records when it is entered and left."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __enter__(self) -> None:
        self.events.append("enter")

    def __exit__(self, *exc_info: object) -> None:
        self.events.append("exit")


def test_warnings_and_logs_are_caught_while_open_and_the_warnings_shown_after():
    imports, handler, registry = Imports(), ListHandler(), {}
    with pytest.warns(UserWarning, match="^weights are float64$"):  # shown again once it closes
        with Capture(lambda: imports, handler, registry) as capture:
            assert imports.events == ["enter"]
            warnings.warn("weights are float64", UserWarning, stacklevel=1)
            logging.getLogger("my_handler").warning("resized %d images", 3)
    assert imports.events == ["enter", "exit"]
    assert [str(w.message) for w in capture.warnings] == ["weights are float64"]
    assert capture.logs == [LogEntry("WARNING", "my_handler", "resized 3 images")]
    assert handler not in logging.root.handlers and handler.entries == []  # taken off the root logger


def test_a_log_call_with_a_bad_format_string_is_kept_as_written():
    handler = ListHandler()
    record = logging.LogRecord("my_handler", logging.INFO, __file__, 1, "took %d ms", ("many",), None)
    handler.emit(record)  # "%d" % "many" raises a TypeError, which must not break the stage
    assert handler.entries == [LogEntry("INFO", "my_handler", "took %d ms")]


def test_without_a_log_handler_logs_are_left_alone():
    with Capture(contextlib.nullcontext, None, {}) as capture:
        logging.getLogger("my_handler").warning("not recorded")
    assert capture.logs == []


def test_the_imports_are_left_when_entering_fails(monkeypatch):
    imports = Imports()

    def refuse(self):
        raise RuntimeError("no more warnings filters")

    monkeypatch.setattr(warnings.catch_warnings, "__enter__", refuse)
    with pytest.raises(RuntimeError, match="^no more warnings filters$"):
        Capture(lambda: imports, ListHandler(), {}).__enter__()
    assert imports.events == ["enter", "exit"]


def test_info_logs_are_enabled_as_torchserves_worker_does(monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", logging.WARNING)
    enable_info_logs()
    assert root.level == logging.INFO
    monkeypatch.setattr(root, "level", logging.DEBUG)  # a user's lower level is kept
    enable_info_logs()
    assert root.level == logging.DEBUG
