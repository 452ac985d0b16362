"""Tests for handlerkit.diagnostics.timing: statistics, repeated passes, reports."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from handlerkit.diagnostics.timing import (
    END_TO_END,
    SweepReport,
    TimingReport,
    TimingStats,
    batch_sizes,
    summarize,
    time_callable_stages,
)
from handlerkit.worker import devices

# --- statistics ----------------------------------------------------------------------------


def test_summarize_matches_numpy() -> None:
    samples = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 9.0, 6.0, 8.0, 7.0]
    s = summarize(samples)
    assert s.n == 10 and s.min == 1.0 and s.total == 55.0 and s.mean == 5.5
    assert s.median == pytest.approx(np.percentile(samples, 50))
    assert s.p90 == pytest.approx(np.percentile(samples, 90)) == pytest.approx(9.1)
    assert (s.p25, s.p75) == (pytest.approx(np.percentile(samples, 25)), pytest.approx(np.percentile(samples, 75)))
    assert s.std == pytest.approx(np.std(samples, ddof=1))


def test_summarize_single_sample() -> None:
    assert summarize([4.0]) == TimingStats(
        n=1, min=4.0, p25=4.0, median=4.0, p75=4.0, p90=4.0, mean=4.0, std=0.0, total=4.0
    )


def test_summarize_rejects_empty_and_non_finite() -> None:
    with pytest.raises(ValueError, match="at least one timing sample"):
        summarize([])
    with pytest.raises(ValueError, match="finite"):
        summarize([1.0, float("nan")])


# --- runner --------------------------------------------------------------------------------


def test_time_callable_stages_discards_warmup_and_adds_end_to_end() -> None:
    calls = []

    def run_once() -> dict[str, float]:
        calls.append(len(calls))
        time.sleep(0.002)
        return {"preprocess": float(len(calls)), "inference": 1.0}

    samples = time_callable_stages(run_once, warmup=2, repeat=3)
    assert len(calls) == 5
    assert list(samples) == ["preprocess", "inference", END_TO_END]
    assert samples["preprocess"] == [3.0, 4.0, 5.0]  # passes 1 and 2 were warm-up
    assert samples["inference"] == [1.0, 1.0, 1.0]
    assert len(samples[END_TO_END]) == 3 and all(ms >= 2.0 for ms in samples[END_TO_END])


def test_time_callable_stages_keeps_a_reported_end_to_end() -> None:
    samples = time_callable_stages(lambda: {"inference": 1.0, END_TO_END: 42.0}, warmup=0, repeat=2)
    assert samples == {"inference": [1.0, 1.0], END_TO_END: [42.0, 42.0]}


def test_time_callable_stages_validates() -> None:
    with pytest.raises(ValueError, match="repeat must be >= 1: got 0"):
        time_callable_stages(dict, warmup=0, repeat=0)
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        time_callable_stages(dict, warmup=-1, repeat=1)
    with pytest.raises(TypeError, match="must return a dict"):
        time_callable_stages(lambda: [1.0], warmup=0, repeat=1)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="stage 'inference'"):
        time_callable_stages(lambda: {"inference": "fast"}, warmup=0, repeat=1)  # type: ignore[dict-item]


def test_batch_sizes() -> None:
    assert batch_sizes(1) == [1]
    assert batch_sizes(8) == [1, 2, 4, 8]
    assert batch_sizes(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError):
        batch_sizes(0)


# --- reports -------------------------------------------------------------------------------


def _report(batch_size: int = 2, scale: float = 1.0) -> TimingReport:
    samples = {
        "preprocess": [1.0 * scale, 1.0 * scale],
        "inference": [6.0 * scale, 6.0 * scale],
        "postprocess": [1.0 * scale, 1.0 * scale],
        END_TO_END: [10.0 * scale, 10.0 * scale],
    }
    return TimingReport.from_samples(samples, batch_size=batch_size, warmup=1, device="cpu", notes=["a <b> note"])


def test_timing_report_from_samples_and_shares() -> None:
    r = _report()
    assert list(r.stages) == ["preprocess", "inference", "postprocess"]
    assert r.end_to_end is not None and r.end_to_end.median == 10.0
    assert r.repeat == 2 and r.warmup == 1
    shares = {row[0]: row[-1] for row in r.rows}
    assert shares == {"preprocess": 10.0, "inference": 60.0, "postprocess": 10.0, END_TO_END: 100.0}
    assert r.throughput == pytest.approx(200.0)  # 2 requests per 10 ms


def test_timing_report_without_end_to_end_shares_the_stage_sum() -> None:
    r = TimingReport.from_samples({"a": [1.0], "b": [3.0]})
    assert r.end_to_end is None and r.throughput is None
    assert [row[-1] for row in r.rows] == [25.0, 75.0]


def test_timing_report_renders_text_and_html() -> None:
    r = _report()
    text = str(r)
    summary = "timing: batch_size=2, warmup=1, repeat=2, device=cpu; throughput 200 requests/s"
    assert repr(r) == f"<TimingReport {summary}>"
    lines = text.splitlines()
    assert lines[0] == summary and lines[1] == ""
    assert lines[2].split() == ["stage", "n", "min", "ms", "median", "ms", "p90", "ms", "mean", "ms", "share", "%"]
    assert any(line.startswith("inference") and line.rstrip().endswith(" 60.0") for line in lines)  # 3 significant digits
    assert text.endswith("note: a <b> note")
    bundle = r._repr_mimebundle_()
    assert bundle["text/plain"] == text
    html = bundle["text/html"]
    assert "<p class='hk-summary'><b>timing:" in html and "style='text-align:left;white-space:nowrap'>inference</td>" in html
    assert "a &lt;b&gt; note" in html and "<b> note" not in html


def test_timing_report_to_dict_is_json() -> None:
    d = json.loads(json.dumps(_report().to_dict()))
    assert d["stages"]["inference"]["median_ms"] == 6.0 and d["stages"]["inference"]["n"] == 2
    assert d["end_to_end"]["p90_ms"] == 10.0
    assert all(key == "n" or key.endswith("_ms") for key in d["stages"]["inference"])  # a unit in every key
    assert d["throughput_rps"] == pytest.approx(200.0)
    assert d["notes"] == ["a <b> note"]


def test_sweep_report_rows_and_throughput() -> None:
    sweep = SweepReport([_report(1, 1.0), _report(2, 1.5), _report(4, 2.5)])
    rows = sweep.rows
    assert [row["batch_size"] for row in rows] == [1, 2, 4]
    assert rows[1]["inference_ms"] == 9.0 and rows[1]["end_to_end_ms"] == 15.0
    assert [row["throughput_rps"] for row in rows] == pytest.approx([100.0, 2 / 0.015, 4 / 0.025])
    assert rows[2]["per_request_ms"] == pytest.approx(25.0 / 4)
    text = str(sweep)
    assert text.splitlines()[0] == "batch-size sweep (median latency), device=cpu"
    assert "requests/s" in text and "inference ms" in text
    assert ">requests/s</th>" in sweep._repr_mimebundle_()["text/html"]
    assert json.loads(json.dumps(sweep.to_dict()))["rows"][0]["throughput_rps"] == pytest.approx(100.0)


def test_sweep_report_with_a_missing_stage_and_no_end_to_end() -> None:
    a = TimingReport.from_samples({"inference": [4.0]}, batch_size=1)
    b = TimingReport.from_samples({"preprocess": [1.0], "inference": [4.0]}, batch_size=2)
    rows = SweepReport([a, b]).rows
    assert rows[0]["preprocess_ms"] is None
    assert rows[1]["end_to_end_ms"] == 5.0  # sum of stage medians
    assert rows[1]["throughput_rps"] == pytest.approx(400.0)
    assert "preprocess ms" in str(SweepReport([a, b]))


def test_timing_names_torchs_threads_and_warns_on_a_busy_machine(monkeypatch) -> None:
    import warnings as warnings_module

    import torch

    import handlerkit as hk
    from handlerkit.errors import HandlerkitWarning
    from handlerkit.worker import devices

    class Double:
        def preprocess(self, data):
            return torch.tensor([row["body"] for row in data], dtype=torch.float32)

        def inference(self, x):
            return x * 2

        def postprocess(self, y):
            return y.tolist()

        def handle(self, data, context):
            return self.postprocess(self.inference(self.preprocess(data)))

    h = hk.Harness(Double(), hk.MockContext())
    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error", HandlerkitWarning)  # a quiet machine: no warning
        monkeypatch.setattr(devices, "cpu_threads", lambda: devices.CpuThreads(2, 2, 2, 0.3))
        quiet = h.time([{"body": [1.0]}], warmup=0, repeat=2, progress=False)
    assert quiet.notes[0] == "torch: 2 intra-op / 2 inter-op threads, 2 usable core(s), 1-minute load 0.3"
    monkeypatch.setattr(devices, "cpu_threads", lambda: devices.CpuThreads(2, 2, 2, 4.5))
    with warnings_module.catch_warnings():
        warnings_module.simplefilter("error", HandlerkitWarning)  # said once: in the report, not on stderr too
        busy = h.time([{"body": [1.0]}], warmup=0, repeat=2, progress=False)
    [said] = [note for note in busy.notes if "1-minute load is 4.5: its threads wait for busy cores" in note]
    assert " ".join(str(busy).split()).count(said) == 1  # the note wraps at 100 columns
    assert "torch threads" in str(h.device_report())


def test_a_sweep_measures_the_conditions_once_and_reports_them(monkeypatch) -> None:
    import warnings as warnings_module

    import handlerkit as hk
    from handlerkit.errors import HandlerkitWarning

    def handle(data, context):
        return None if data is None else [len(row["body"]) for row in data]

    h = hk.Harness(handle, hk.MockContext())
    measured = []

    def busy() -> devices.CpuThreads:
        measured.append(1)
        return devices.CpuThreads(2, 2, 2, 4.5)

    monkeypatch.setattr(devices, "cpu_threads", busy)
    with warnings_module.catch_warnings(record=True) as caught:
        warnings_module.simplefilter("always")
        sweep = h.sweep([{"body": [1.0]}], batch_sizes=[1, 2], warmup=0, repeat=1, progress=False)
    said = devices.CpuThreads(2, 2, 2, 4.5).warning
    assert len(measured) == 1 and not [w for w in caught if issubclass(w.category, HandlerkitWarning)]
    assert said is not None and "1-minute load is 4.5" in said  # said once: in the notes, not as a warning too
    assert sweep.notes == ["torch: 2 intra-op / 2 inter-op threads, 2 usable core(s), 1-minute load 4.5", said]
    assert "1-minute load is 4.5" in str(sweep) and "1-minute load is 4.5" in sweep._repr_mimebundle_()["text/html"]
    data = json.loads(json.dumps(sweep.to_dict()))
    assert data["conditions"]["load_1min"] == 4.5 and data["conditions"]["warning"] == said
    assert all(report["conditions"]["load_1min"] == 4.5 for report in data["reports"])
