"""handlerkit.diagnostics.device: the device report's facts, read from a harness double (no GPU:
the ``meta`` device stands in for a second one)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

import handlerkit as hk
from handlerkit.diagnostics.device import (
    DeviceReport,
    build_device_report,
    fp32_precision_state,
    gpu_facts,
    model_placement,
    watch_copies,
)
from handlerkit.recording.results import StageResult


class Split(torch.nn.Module):
    """Half of it on the CPU, half on another device."""

    def __init__(self) -> None:
        super().__init__()
        self.here = torch.nn.Linear(2, 2)
        self.there = torch.nn.Linear(2, 2, device="meta")
        self.register_buffer("scale", torch.ones(3, dtype=torch.float16))


def test_model_placement_counts_elements_per_device_and_dtype():
    placement = model_placement(Split())
    assert placement == {"parameters": {"cpu float32": 6, "meta float32": 6}, "buffers": {"cpu float16": 3}}
    wrapped = SimpleNamespace(_orig_mod=torch.nn.Linear(3, 1))  # as torch.compile wraps a model
    assert model_placement(wrapped) == {"parameters": {"cpu float32": 4}, "buffers": {}}
    assert model_placement(object()) == {"parameters": {}, "buffers": {}}


def test_watch_copies_lists_moves_between_devices_only():
    cpu = torch.ones(2, 3)

    def work():
        cpu.to(torch.float64)  # same device: no copy
        moved = cpu.to("meta")
        torch.empty(2, 3, device="meta").copy_(cpu)
        return moved

    result, copies = watch_copies(work)
    assert result.device.type == "meta"
    assert copies == ["to: cpu -> meta [2, 3]", "copy_: cpu -> meta [2, 3]"]


def test_cpu_facts():
    assert gpu_facts(torch.device("cpu")) == {}
    assert set(fp32_precision_state()) == {"matmul (cuda)", "cudnn conv", "cudnn rnn"}


class Handler:
    def __init__(self) -> None:
        self.model = Split()
        self.device = torch.device("cpu")

    def inference(self, data):
        return data.to("meta")


class View:
    """A harness double (HarnessView's members that device_report reads)."""

    name = "Handler"
    single_stage = False

    def __init__(self) -> None:
        self.handler = Handler()
        self.imported = 0
        pre = StageResult("preprocess", output=torch.ones(1, 2))
        inf = StageResult("inference", input=torch.ones(1, 2), output=torch.ones(1, 2, device="meta"))
        self.results = {"initialize": StageResult("initialize"), "preprocess": pre, "inference": inf}

    @contextlib.contextmanager
    def imports(self):
        self.imported += 1
        yield


def test_the_report_of_a_handler_that_records_no_decisions():
    view = View()
    report = build_device_report(view)
    assert report.handler == "Handler" and report.device == "cpu"
    assert report.reason == "chosen by the handler (it does not record why)"
    assert report.stage_devices == {"preprocess": ["cpu"], "inference": ["cpu", "meta"]}
    assert report.copies == ["to: cpu -> meta [1, 2]"] and view.imported == 1
    assert report.warnings == [
        "the model is spread over ['cpu', 'meta']: move it with model.to(self.device)",
        "inference sees tensors on ['cpu', 'meta']: inputs and model should share one device",
        "1 host<->device copy inside inference: move data in preprocess and results in postprocess",
    ]
    rows = dict(report.rows())
    assert rows["model parameters"] == "cpu float32: 6, meta float32: 6"
    assert rows["fp32 precision (TF32)"].endswith("(CUDA settings; this handler runs on cpu)")


def test_a_failing_rerun_is_reported_not_raised():
    view = View()
    view.handler.inference = lambda data: (_ for _ in ()).throw(RuntimeError("out of memory"))
    report = build_device_report(view)
    assert report.copies == ["(could not re-run inference to watch copies: RuntimeError: out of memory)"]


def test_single_stage_handlers_are_not_rerun():
    view = View()
    view.single_stage = True
    assert build_device_report(view).copies == [] and view.imported == 0


def test_the_report_of_a_real_harness(argmax_dir):
    ctx = hk.MockContext(model_pt_file="model.pt", model_dir=str(argmax_dir), model_file="model.py", gpu_id=None)
    h = hk.Harness(hk.BaseHandler, ctx)
    h.run(hk.batch(hk.Request.json([1.0, 2.0])))
    report = h.device_report()
    assert isinstance(report, DeviceReport)
    assert report.device == str(h.handler.device) and report.copies == [] and report.warnings == []
    assert report.reason == h.handler.decisions.device_reason  # the handler's recorded decision
    assert report.stage_devices["inference"] == [str(h.handler.device)]
