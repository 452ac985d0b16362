"""The rendering base: one-line repr, table str, a guarded mimebundle with a text/plain twin."""

from __future__ import annotations

import pytest

from handlerkit._render import Rendered, Table
from handlerkit.errors import HandlerkitWarning


class Report(Rendered):
    def __init__(self, rows, notes=()):
        self.rows = rows
        self.notes = list(notes)

    def _summary(self) -> str:
        return f"report of {len(self.rows)} row(s)"

    def _tables(self) -> list[Table]:
        return [Table(("name", "value"), self.rows, "values"), Table(("empty",), [])]

    def _notes(self) -> list[str]:
        return self.notes


def test_repr_is_one_line_and_str_is_the_table():
    report = Report([["a", 1.5], ["<b>", 20]], notes=["x < y"])
    assert repr(report) == "<Report report of 2 row(s)>"
    assert str(report).splitlines() == [
        "report of 2 row(s)",
        "",
        "values",
        "name  value",
        "----  -----",
        "a      1.50",
        "<b>      20",
        "note: x < y",
    ]


def test_mimebundle_has_plain_text_and_escaped_html():
    report = Report([["<b>", 1]], notes=["x < y"])
    bundle = report._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"] == str(report)
    html = bundle["text/html"]
    assert ">&lt;b&gt;</td>" in html and "<li>x &lt; y</li>" in html
    assert ">empty</th>" not in html  # a table without rows is left out


def test_a_failing_render_warns_then_raises():
    class Broken(Report):
        def _tables(self):
            raise ValueError("a row is not a sequence")

    with pytest.warns(HandlerkitWarning, match="Broken could not render itself: ValueError: a row is not a sequence"):
        with pytest.raises(ValueError, match="a row is not a sequence"):
            Broken([])._repr_mimebundle_()


def test_every_report_and_result_uses_the_base():
    from handlerkit.diagnostics.checks import CheckReport
    from handlerkit.diagnostics.device import DeviceReport
    from handlerkit.diagnostics.timing import SweepReport, TimingReport
    from handlerkit.recording.results import Run, StageResult

    for cls in (StageResult, Run, CheckReport, DeviceReport, TimingReport, SweepReport):
        assert issubclass(cls, Rendered), cls
        assert "_repr_html_" not in vars(cls) and "_repr_mimebundle_" not in vars(cls), cls
