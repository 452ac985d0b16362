"""The format lab's report (:mod:`handlerkit.diagnostics.format_lab.report`): the best format is
declared only beyond the runs' noise and on a quiet machine."""

from __future__ import annotations

import pytest

from handlerkit.diagnostics.format_lab import FormatReport, FormatRow
from handlerkit.diagnostics.timing import summarize


def test_report_without_timed_rows_has_no_best():
    report = FormatReport("H", 2, rows=[FormatRow("eager", exported=True, answers_agree=True)])
    assert report.ok and report.best is None
    with pytest.raises(KeyError, match="no 'onnx' row"):
        report.row("onnx")


def _timed(fmt: str, *samples: float) -> FormatRow:
    return FormatRow(fmt, exported=True, answers_agree=True, steady=summarize(samples))


def test_the_best_is_declared_only_beyond_the_runs_noise():
    noisy = FormatReport("H", 2, rows=[_timed("eager", 1.0, 1.6, 1.2, 1.1, 1.15), _timed("onnx", 0.9, 1.5, 1.2, 1.0, 1.1),
                                       _timed("torchscript", 3.0, 3.1, 3.2, 3.0)])  # fmt: skip
    assert noisy.best is None and noisy.verdict.within_noise == ("onnx", "eager")  # torchscript: clearly slower
    said = "no clear winner (within noise: onnx 1.1 ms (p25-p75 1-1.2), eager 1.15 ms (p25-p75 1.1-1.2))"
    assert repr(noisy) == f"<FormatReport formats of H (batch 2, cpu): {said}>"
    assert said in noisy._repr_mimebundle_()["text/html"]
    assert (noisy.to_dict()["best"], noisy.to_dict()["verdict"]) == (None, said)
    assert "p25-p75 ms" in str(noisy) and "3-3.12" in str(noisy)

    clear = FormatReport("H", 2, rows=[_timed("eager", 2.0, 2.1, 2.2), _timed("onnx", 1.0, 1.1, 1.0)])
    assert clear.best is clear.row("onnx") and clear.to_dict()["best"] == "onnx"
    assert repr(clear) == "<FormatReport formats of H (batch 2, cpu): best: onnx>"


def test_a_lead_measured_on_a_busy_machine_is_not_called_best():
    from handlerkit.diagnostics.noise import Conditions
    from handlerkit.worker import devices

    rows = [_timed("eager", 2.0, 2.1, 2.2), _timed("onnx", 1.0, 1.1, 1.0)]
    busy = FormatReport("H", 2, rows=rows, conditions=Conditions(devices.CpuThreads(1, 1, 2, 4.2)))
    assert repr(busy) == (
        "<FormatReport formats of H (batch 2, cpu): fastest here: onnx, measured at load 4.2 on 2 core(s) "
        "(time it on a quiet machine to call it best)>"
    )
    quiet = FormatReport("H", 2, rows=rows, conditions=Conditions(devices.CpuThreads(1, 1, 2, 0.4)))
    assert repr(quiet) == "<FormatReport formats of H (batch 2, cpu): best: onnx>"
