"""Every report object shows itself two ways that read well: text that fits 100 columns, and
HTML with handlerkit's stylesheet, prose cells marked text (left) and numbers marked numeric
(right, tabular digits) to 3 significant digits.

The reports are built on small real objects: the ranker of tests/_new_users.py (several inputs,
ragged item lists), a model with a graph break for the compile report, the four-input MLP for the
format lab, the strict fake v2 server (breaking two rules), the fixture classifier's archive, and
the stateful summing handler's sequences.
"""

from __future__ import annotations

import re
import warnings
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from _new_users import ranker_dir, ranker_request
from _stateful_handlers import SEQUENCE_CONFIG, SEQUENCE_SUM, model_dir
from _v2_fake import fake_v2_server

import handlerkit as hk
from conftest import BREAK_MODEL_PY, MLP_MODEL_PY, eager_manifest, write_model_dir
from handlerkit import archive
from handlerkit._text import STYLE, format_number, render_html, render_text
from handlerkit.cli.inspect import inspect_path
from handlerkit.diagnostics.compile import compile_report
from handlerkit.handlers.base import BaseHandler
from handlerkit.sequences import Sequences
from handlerkit.serving.v2_check import check

ROOT = Path(__file__).resolve().parents[2]

#: A source of its own (a comment added), so no earlier test's compile is reused.
BREAK_SOURCE = BREAK_MODEL_PY + "# test_report_views\n"
BATCH = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]]


class Cells(HTMLParser):
    """Each ``<td>`` (a header ``<th>`` is marked like its column, and left out): its class and text."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, str]] = []
        self._open: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "td":
            self._open, self._text = dict(attrs).get("class") or "", []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._open is not None:
            self.cells.append((self._open, "".join(self._text)))
            self._open = None


NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]\d+)?")


def significant(text: str) -> int:
    """How many significant digits a number cell shows (a whole number counts as exact)."""
    if "." not in text or "e" in text:
        return 3 if "e" in text else 0
    digits = text.lstrip("-").replace(".", "").lstrip("0")
    return len(digits)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("views")
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a busy machine's thread warning is not what is tested here
        h = hk.Harness.open(ranker_dir(tmp / "ranker"))
        asked = (ranker_request(1, [3, 5, 7, 9]), ranker_request(2, [4, 6]), ranker_request(3, list(range(7))))
        data = hk.batch(*(hk.Request.json(body) for body in asked))
        run = h.run(data)
        out["Run"], out["StageResult"] = run, run.stages["inference"]
        with pytest.raises(hk.StageError):
            h.run(hk.batch(hk.Request.json(ranker_request(1, [3, 99]))))  # item 99 is past the embedding: the run fails
        out["failed Run"] = h.last_run
        out["TimingReport"] = h.time(data, warmup=0, repeat=2, progress=False)
        out["SweepReport"] = h.sweep(data, batch_sizes=(1, 3), warmup=0, repeat=1, progress=False)
        out["CheckReport"] = h.check(data, progress=False)
        out["DeviceReport"] = h.device_report()
        out["ProfileReport"] = h.profile(data, top=3, progress=False)
        breaky = write_model_dir(tmp / "breaky", BREAK_SOURCE)
        pt2 = {"pt2": {"compile": {"enable": True, "backend": "eager"}}}
        ctx = hk.MockContext(model_dir=breaky, gpu_id=None, manifest=eager_manifest(), model_yaml_config=pt2)
        out["CompileReport"] = compile_report(
            hk.Harness(BaseHandler, ctx), hk.Batch.coerce(BATCH), batch_sizes=[1, 2], repeat=1, warmup=0, progress=False
        )
        mlp = write_model_dir(tmp / "mlp", MLP_MODEL_PY)
        ctx = hk.MockContext(model_dir=mlp, gpu_id=None, manifest=eager_manifest(), model_yaml_config={})
        out["FormatReport"] = hk.Harness(BaseHandler, ctx).compare_formats(BATCH, formats=["torchscript"], repeat=2, warmup=0)
        with fake_v2_server("id", "live") as url:
            out["V2Report"] = check(url)
        out["InspectReport"] = inspect_path(str(mlp))
        classifier = ROOT / "fixtures" / "models" / "image_classifier"
        out["Plan"] = archive.plan(classifier, tmp / "planned", version="2.5")
        out["ArchiveInfo"] = archive.inspect_archive(classifier)
        seqs = Sequences(hk.Harness.open(model_dir(tmp, "sums", SEQUENCE_SUM, SEQUENCE_CONFIG)))
        seqs.start(hk.Request.text("1")).send(hk.Request.text("2"))
        out["Step"] = seqs.run()[0]
    return out


NAMES = [
    "Run", "StageResult", "failed Run", "TimingReport", "SweepReport", "CheckReport", "DeviceReport", "ProfileReport",
    "CompileReport", "FormatReport", "V2Report", "InspectReport", "Plan", "ArchiveInfo", "Step",
]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_every_report_fits_100_columns_and_its_html_marks_text_and_numbers(reports, name):
    report = reports[name]
    text = str(report)
    too_wide = [line for line in text.splitlines() if len(line) > 100]
    assert not too_wide, f"{name}: {len(too_wide)} line(s) wider than 100 columns, the first: {too_wide[0]!r}"

    bundle = report._repr_mimebundle_()
    assert bundle["text/plain"] == text
    markup = bundle["text/html"]
    assert markup.startswith("<div class='handlerkit'><style>") and markup.count("<style>") == 1
    assert "<table class='handlerkit'>" in markup
    parser = Cells()
    parser.feed(markup)
    assert parser.cells, name
    for kind, cell in parser.cells:
        assert kind in ("hk-text", "hk-num"), (name, kind, cell)
        if kind == "hk-num" and cell:
            assert NUMBER.fullmatch(cell), (name, cell)  # numeric: a number, and only that
            assert significant(cell) <= 3, f"{name}: {cell} has more than 3 significant digits"
        elif re.search(r"[a-zA-Z]{3}", cell) and " " in cell.strip():
            assert kind == "hk-text"  # prose is never right-aligned


def test_a_check_that_passes_is_one_line_and_a_problem_is_said_once(reports):
    text = str(reports["CheckReport"])
    assert text.count("same alone and in the batch") == 1
    assert sum("same output" in line for line in text.splitlines()) <= 1  # every encoding that passed, on one line
    v2 = reports["V2Report"]
    assert len(v2.failures) == 3 and str(v2).count("expected 200, got 503") == 1
    flat = " ".join(str(v2).split())
    assert flat.startswith("Open Inference Protocol v2: 21 of 24 rules pass")
    assert flat.count("GET /v2/health/ready") == 1  # a passing endpoint: one line


def test_numbers_have_3_significant_digits_and_whole_numbers_stay_whole():
    shown = [format_number(v) for v in (100.0, 61890.9, 45.192, 3.104, 0.012345, 0.0, 99.96, -2.5, 7, 1e-6)]
    assert shown == ["100", "61891", "45.2", "3.10", "0.0123", "0", "100", "-2.50", "7", "1.00e-06"]


def test_the_stylesheet_beats_jupyterlabs_right_alignment_and_untrusted_views_keep_the_alignment():
    # JupyterLab: ":not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td {text-align: right}", specificity
    # (0,2,1). Ours names the table's class and the cell's: (0,2,2).
    assert "table.handlerkit td.hk-text,table.handlerkit th.hk-text{text-align:left" in STYLE
    assert "font-variant-numeric:tabular-nums" in STYLE and "overflow-wrap:anywhere" in STYLE
    markup = render_html(["file", "ms"], [["a/very/long/path.py: a line of source", 1.23456]])
    # JupyterLab strips <style> from an untrusted notebook but keeps inline styles
    assert "class='hk-text' style='text-align:left" in markup and "class='hk-num' style='text-align:right" in markup
    assert ">1.23</td>" in markup


def test_a_units_column_shows_us_as_micro_and_no_column_mixes_a_unit_into_a_number(reports):
    text = str(reports["ProfileReport"])
    assert "self CPU µs" in text and not re.search(r" us( |$)", text, re.M)
    assert "0 B" not in str(reports["FormatReport"])  # nothing measured is "—", with a note saying so


def test_a_table_too_wide_for_the_terminal_prints_a_block_per_row():
    headers = [f"column {i}" for i in range(12)]
    lines = render_text(headers, [[f"value {i} of a long row" for i in range(12)], [i * 1.5 for i in range(12)]]).splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0] == "column 0   value 0 of a long row" and lines[12] == "" and lines[13] == "column 0   0"
