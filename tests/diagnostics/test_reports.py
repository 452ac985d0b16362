"""handlerkit.diagnostics.reports: the Harness's report methods are thin calls into the diagnostics.

Each method coerces what it is given into a Batch (refusing what is none, before any diagnostic
runs), hands the diagnostic the harness and every argument, and returns the diagnostic's report
as it is. The diagnostics themselves are tested in their own modules (test_diagnostics_*.py).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import handlerkit as hk
from handlerkit.diagnostics.reports import Reports
from handlerkit.worker.batches import Batch


class Affine:
    """A small class handler: a Linear(2, 2) over each request's two numbers."""

    def initialize(self, context):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(2, 2)

    def preprocess(self, data):
        return torch.tensor([row["body"] for row in data], dtype=torch.float32)

    def inference(self, x):
        with torch.inference_mode():
            return self.model(x)

    def postprocess(self, y):
        return y.tolist()

    def handle(self, data, context):
        return self.postprocess(self.inference(self.preprocess(data)))


DATA = [{"body": [1.0, 2.0]}, {"body": [3.0, 4.0]}]

#: method, the diagnostic it calls (module, function), the arguments given (none at its default)
CALLS = [
    ("time", "timing", "time_stages", {"warmup": 1, "repeat": 2, "progress": False}),
    ("sweep", "timing", "sweep_stages", {"batch_sizes": (1, 3), "warmup": 0, "repeat": 1, "progress": False}),
    ("check", "checks", "run_checks", {"atol": 0.5, "rtol": 0.25, "progress": False}),
    ("compile_report", "compile", "compile_report", {"batch_sizes": (1, 2), "repeat": 2, "warmup": 0, "progress": False}),
    ("profile", "profile", "profile_stages", {"top": 3, "record_shapes": True, "trace": "t.json", "progress": False}),
]


@pytest.fixture
def harness():
    return hk.Harness(Affine(), hk.MockContext())


@pytest.fixture
def fake(monkeypatch):
    """fake(module, function): that diagnostic records its calls and returns a sentinel report."""

    def install(module: str, function: str):
        calls = []
        report = object()

        def diagnostic(*args, **kwargs):
            calls.append((args, kwargs))
            return report

        monkeypatch.setattr(importlib.import_module(f"handlerkit.diagnostics.{module}"), function, diagnostic)
        return calls, report

    return install


def test_the_harness_offers_every_report():
    assert issubclass(hk.Harness, Reports)
    for method in ("time", "sweep", "device_report", "check", "compile_report", "profile"):
        assert getattr(hk.Harness, method) is getattr(Reports, method), method


@pytest.mark.parametrize("method, module, function, kwargs", CALLS, ids=[c[0] for c in CALLS])
def test_each_report_coerces_its_batch_and_returns_the_diagnostics_report(harness, fake, method, module, function, kwargs):
    calls, report = fake(module, function)
    assert getattr(harness, method)(DATA, **kwargs) is report
    ((view, batch), forwarded), = calls
    assert view is harness
    assert isinstance(batch, Batch) and batch.data == DATA  # the raw list, as handle() takes it
    assert forwarded == kwargs
    given = hk.batch(hk.Request.json([1.0, 2.0]))
    getattr(harness, method)(given, **kwargs)
    assert calls[-1][0][1] is given  # a Batch is used as it is
    request = hk.Request.json([5.0, 6.0])
    getattr(harness, method)(request, **kwargs)
    assert [r.request_id for r in calls[-1][0][1]] == [request.request_id]  # a Request: a batch of one


@pytest.mark.parametrize("method, module, function, kwargs", CALLS, ids=[c[0] for c in CALLS])
def test_what_is_no_batch_is_refused_before_the_diagnostic_runs(harness, fake, method, module, function, kwargs):
    calls, _ = fake(module, function)
    with pytest.raises(TypeError, match=r"expected a batch: .*: got a str; pass a list: \[x\], or hk\.batch"):
        getattr(harness, method)("not a batch", **kwargs)
    assert calls == []


def test_the_device_report_takes_no_batch(harness, fake):
    calls, report = fake("device", "build_device_report")
    assert harness.device_report() is report
    assert calls == [((harness,), {})]


def test_the_reports_of_a_small_handler_are_the_diagnostics_own(harness):
    from handlerkit.diagnostics.checks import CheckReport
    from handlerkit.diagnostics.compile import CompileReport
    from handlerkit.diagnostics.device import DeviceReport
    from handlerkit.diagnostics.profile import ProfileReport
    from handlerkit.diagnostics.timing import SweepReport, TimingReport

    timing = harness.time(DATA, warmup=0, repeat=2, progress=False)
    assert isinstance(timing, TimingReport) and timing.batch_size == 2 and timing.stages["inference"].n == 2
    sweep = harness.sweep(DATA, batch_sizes=(1, 3), warmup=0, repeat=1, progress=False)
    assert isinstance(sweep, SweepReport) and [row["batch_size"] for row in sweep.rows] == [1, 3]
    check = harness.check(DATA, progress=False)
    assert isinstance(check, CheckReport) and check.ok, check
    assert isinstance(harness.device_report(), DeviceReport)
    profile = harness.profile(DATA, top=3, progress=False)
    assert isinstance(profile, ProfileReport) and "top 3 operators per stage" in repr(profile)
    compiled = harness.compile_report(DATA, repeat=1, warmup=0, progress=False)
    assert isinstance(compiled, CompileReport) and "not compiled (no pt2 section" in repr(compiled)
