"""Tests for handlerkit.diagnostics.profile: per-stage operators under torch.profiler."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import handlerkit as hk
import handlerkit.worker.devices as device_mod
from handlerkit.diagnostics import profile as profile_mod
from handlerkit.diagnostics.profile import (
    OpStats,
    ProfileReport,
    aggregate,
    format_shapes,
    profile_stages,
    profiler_activities,
)
from handlerkit.errors import HandlerkitError, StageError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
STAGE_NAMES = ("preprocess", "inference", "postprocess")


@pytest.fixture(scope="module")
def classifier() -> hk.Harness:
    """The fixture image classifier, initialized once for the module (profiling leaves it as it was)."""
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(FIXTURES / "models" / "image_classifier"))
    h.initialize()
    return h


@pytest.fixture(scope="module")
def two_images() -> hk.Batch:
    return hk.batch(hk.Request.from_file(FIXTURES / "images" / "circle.png"), hk.Request.from_file(FIXTURES / "images" / "star.jpg"))


class Toy:
    """A model-free handler: its stages do a few torch ops; ``fail`` makes inference raise."""

    def __init__(self, device: Any = "cpu") -> None:
        self.device = torch.device(device)
        self.fail = False
        self.initialized = False

    def initialize(self, context: Any) -> None:
        self.initialized = True

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        return torch.arange(8.0).repeat(len(data), 1) / 2.0

    def inference(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("inference blew up")
        return torch.mm(x, torch.ones(8, 4))

    def postprocess(self, y: torch.Tensor) -> list[float]:
        return y.sum(dim=1).tolist()

    def handle(self, data: list[Any], context: Any) -> list[float]:
        return self.postprocess(self.inference(self.preprocess(data)))


def toy_harness(handler: Toy | None = None) -> hk.Harness:
    h = hk.Harness(handler or Toy(), hk.MockContext(), track_memory=False)
    h.initialize()
    return h


def op_names(report: ProfileReport, stage: str) -> list[str]:
    return [r.name for r in report.stages[stage]]


# --- the fixture image classifier ---------------------------------------------------------------


def test_model_ops_are_under_inference_and_the_harness_is_left_as_it_was(classifier, two_images, capfd):
    classifier.run(two_images)
    results, batch = dict(classifier.results), classifier.batch
    handler = classifier.handler
    before_class, before_attrs = type(handler), set(vars(handler))

    report = classifier.profile(two_images, top=50)

    assert list(report.stages) == list(STAGE_NAMES)  # nothing ran outside the stages
    inference, preprocess = op_names(report, "inference"), op_names(report, "preprocess")
    assert any("conv" in n for n in inference), inference
    assert any(n.startswith("aten::") for n in preprocess)
    assert not any("conv" in n for n in preprocess), preprocess  # the model's ops are not preprocess's
    assert not set(preprocess) >= set(inference)  # preprocess shows its own operators
    for stage in STAGE_NAMES:
        totals = report.totals[stage]
        assert totals.calls == 1 and totals.cpu_us >= totals.self_cpu_us > 0
    assert report.totals["handle"].cpu_us >= sum(report.totals[s].cpu_us for s in STAGE_NAMES)
    # handle found the labelled stage methods on the instance; they are gone again
    assert type(handler) is before_class and set(vars(handler)) == before_attrs
    assert not any(s in vars(handler) for s in STAGE_NAMES)
    assert classifier.results == results and classifier.batch is batch
    assert not torch.autograd._profiler_enabled()
    # kineto's "profiler_start"/"profiler_stop" lines stay out of the output (and out of nbval's)
    assert "profiler_st" not in capfd.readouterr().err


def test_top_keeps_the_slowest_operators_of_each_stage(classifier, two_images):
    report = classifier.profile(two_images, top=3)
    assert report.totals["inference"].operators > 3
    for stage, rows in report.stages.items():
        assert 1 <= len(rows) <= 3
        times = [r.self_cpu_us for r in rows]
        assert times == sorted(times, reverse=True)
    text = str(report)
    assert f"inference: top 3 of {report.totals['inference'].operators} operators" in text
    assert "input shapes" not in text and "device" not in text.split("\n", 1)[1]
    assert all(r.shapes is None and r.self_device_us is None for rows in report.stages.values() for r in rows)


def test_record_shapes_shows_input_shapes(classifier, two_images):
    report = classifier.profile(two_images, top=100, record_shapes=True)
    convs = [r for r in report.stages["inference"] if "conv" in r.name and r.shapes]
    assert convs
    # the batch of 2 goes into the first convolution: [2, 1, 56, 56] against 16 filters of 1x3x3
    assert any(r.shapes[0] == (2, 1, 56, 56) and r.shapes[1] == (16, 1, 3, 3) for r in convs), convs
    text = str(report)
    assert "input shapes" in text and "2x1x56x56, 16x1x3x3" in text


def test_trace_is_a_chrome_trace_with_the_stage_ranges(classifier, two_images, tmp_path):
    path = tmp_path / "trace.json"
    report = classifier.profile(two_images, trace=path)
    events = json.loads(path.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"handlerkit::preprocess", "handlerkit::inference", "handlerkit::handle"} <= names
    assert report.trace == str(path) and str(path) in str(report)


def test_trace_into_a_missing_folder_fails_before_running(classifier, two_images, tmp_path):
    calls = len(classifier.results)
    with pytest.raises(HandlerkitError, match="does not exist") as info:
        classifier.profile(two_images, trace=tmp_path / "nope" / "trace.json")
    assert info.value.fix and len(classifier.results) == calls


def test_report_renders_html_and_plain_data(classifier, two_images):
    report = classifier.profile(two_images, top=2, progress=False)
    bundle = report._repr_mimebundle_()
    assert bundle["text/plain"] == str(report)
    html = bundle["text/html"]
    assert html.count("<table") == 1 + len(report.stages) and "inference: top 2 of" in html
    data = json.loads(json.dumps(report.to_dict()))
    assert data["stages"]["inference"][0]["name"] == report.stages["inference"][0].name
    assert data["activities"] == ["CPU"] and data["device_time"] is False
    assert repr(report).startswith("<ProfileReport profile of ImageClassifier: batch_size=2")


def test_progress_bar_counts_warmup_and_profiled_runs(classifier, two_images, monkeypatch, capsys):
    seen: list[Any] = []

    class RecordingBar(profile_mod.Bar):
        def __init__(self, total: int | None, desc: str, progress: bool | None = None) -> None:
            super().__init__(total, desc, progress)
            seen.append([total, desc, progress, 0])

        def update(self, n: int = 1) -> None:
            super().update(n)
            seen[-1][3] += n

    monkeypatch.setattr(profile_mod, "Bar", RecordingBar)
    profile_stages(classifier, two_images, warmup=2, progress=True)
    assert seen == [[3, "profiling ImageClassifier", True, 3]]
    assert "profiling ImageClassifier" in capsys.readouterr().err  # drawn: progress=True forces it


# --- other handlers ------------------------------------------------------------------------------


def test_function_handler_has_one_handle_range():
    def handle(data: Any, context: Any) -> Any:
        if data is None:
            return None
        x = torch.ones(len(data), 4)
        return (x @ x.T).sum(dim=1).tolist()

    h = hk.Harness(handle, hk.MockContext())
    report = h.profile([[1], [2]], top=50)  # every operator: self times are noisy
    assert list(report.stages) == ["handle"] and list(report.totals) == ["handle"]
    assert "aten::mm" in op_names(report, "handle") or "aten::matmul" in op_names(report, "handle")
    assert report.totals["handle"].calls == 1
    assert "(whole run)" not in str(report) and "outside the stages" not in str(report)


def test_a_handle_that_bypasses_the_labels_says_so():
    class Grabbing(Toy):
        """Takes its stage methods before the run, as TorchServe's MicroBatching does."""

        def __init__(self) -> None:
            super().__init__()
            self._stages = (self.preprocess, self.inference, self.postprocess)

        def handle(self, data: list[Any], context: Any) -> list[float]:
            pre, inf, post = self._stages
            return post(inf(pre(data)))

    report = toy_harness(Grabbing()).profile([[1]], top=50)  # every operator: self times are noisy
    assert list(report.stages) == ["handle"]
    assert "aten::mm" in op_names(report, "handle")
    assert any("MicroBatching" in n for n in report.notes)


def test_a_profile_says_what_it_was_timed_under_and_warns_on_a_busy_machine(monkeypatch):
    from handlerkit.errors import HandlerkitWarning

    monkeypatch.setattr(device_mod, "cpu_threads", lambda: device_mod.CpuThreads(2, 1, 2, 5.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # said once: in the report's notes
        report = toy_harness(Toy()).profile([[1]], top=3)
    warning = device_mod.CpuThreads(2, 1, 2, 5.0).warning
    assert report.notes == ["torch: 2 intra-op / 1 inter-op threads, 2 usable core(s), 1-minute load 5.0", warning]
    assert " ".join(str(report).split()).endswith(f"note: {warning}")  # wrapped at 100 columns
    data = json.loads(json.dumps(report.to_dict()))
    assert data["conditions"] == {"intra_op_threads": 2, "inter_op_threads": 1, "cores": 2, "load_1min": 5.0,
                                  "warning": warning}  # fmt: skip


def test_a_failing_stage_raises_and_leaves_the_handler_usable():
    toy = Toy()
    own_preprocess = toy.preprocess  # an instance attribute of the user's own: kept as it was
    vars(toy)["preprocess"] = own_preprocess
    h = toy_harness(toy)
    good = h.run([[1]])
    toy.fail = True
    with pytest.raises(StageError, match="inference blew up") as info:
        profile_stages(h, hk.Batch.coerce([[1], [2]]), warmup=0)
    assert info.value.stage == "inference"
    assert vars(toy)["preprocess"] is own_preprocess
    assert "inference" not in vars(toy) and "postprocess" not in vars(toy)
    assert not torch.autograd._profiler_enabled()
    toy.fail = False
    assert h.run([[1]]).output == good.output
    report = profile_stages(h, hk.Batch.coerce([[1]]), warmup=0, top=50)  # profiling works again
    assert "aten::mm" in op_names(report, "inference")
    assert vars(toy)["preprocess"] is own_preprocess


def test_bad_arguments_and_a_second_profiler_are_refused(monkeypatch):
    h = toy_harness()
    batch = hk.Batch.coerce([[1]])
    for top in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="top must be a positive integer"):
            profile_stages(h, batch, top=top)
    with pytest.raises(ValueError, match="warmup"):
        profile_stages(h, batch, warmup=-1)
    with torch.profiler.profile():
        with pytest.raises(HandlerkitError, match="already running"):
            profile_stages(h, batch)
    monkeypatch.setenv("ENABLE_TORCH_PROFILER", "true")
    with pytest.raises(HandlerkitError, match="ENABLE_TORCH_PROFILER") as info:
        profile_stages(h, batch)
    assert "ENABLE_TORCH_PROFILER" in info.value.fix


def test_profile_initializes_a_fresh_harness():
    h = hk.Harness(Toy(), hk.MockContext())
    report = h.profile([[1]])
    assert h.handler.initialized and "initialize" in h.results
    assert set(report.stages) == set(STAGE_NAMES)


# --- CUDA, faked ----------------------------------------------------------------------------------


def test_activities_follow_the_handlers_device_and_cuda_availability(monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    assert profiler_activities(torch.device("cuda:0")) == ["CPU", "CUDA"]
    assert profiler_activities("cuda") == ["CPU", "CUDA"]
    assert profiler_activities(torch.device("cpu")) == ["CPU"]
    assert profiler_activities(None) == ["CPU"]
    monkeypatch.setattr(device_mod, "cuda_available", lambda: False)
    assert profiler_activities(torch.device("cuda:0")) == ["CPU"]


class _FakeCudaEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self) -> None:
        pass

    def elapsed_time(self, end: Any) -> float:
        return 1.0


def test_cuda_profile_with_faked_availability_records_and_renders_device_time(monkeypatch):
    """Faked: ``handlerkit.worker.devices.cuda_available`` (True), ``torch.cuda.synchronize`` and
    ``torch.cuda.Event`` (the harness's timer syncs a CUDA handler), and ``torch.profiler.profile``:
    a subclass that notes the activities asked for, records the CPU only (this machine has no
    GPU), and hands each ``aten::mm`` a 40 us kernel the way torch attaches launched kernels to
    their CPU operator. The Toy handler says it is on cuda:0 but computes on the CPU."""
    real_profile = torch.profiler.profile
    asked: list[set[Any]] = []

    class FakeCudaProfile(real_profile):
        def __init__(self, *, activities: Any, **kwargs: Any) -> None:
            asked.append(set(activities))
            super().__init__(activities=[torch.profiler.ProfilerActivity.CPU], **kwargs)

        def events(self) -> Any:
            events = super().events()
            for evt in events:
                if evt.name == "aten::mm":
                    evt.use_device = "cuda"
                    evt.append_kernel("gemm_kernel", 0, 40.0)
            return events

    h = toy_harness(Toy(device="cuda:0"))  # initialized before CUDA appears
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(torch.profiler, "profile", FakeCudaProfile)

    report = h.profile([[1], [2]], top=3)

    assert asked == [{torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA}]
    assert report.activities == ["CPU", "CUDA"] and report.device_time and report.device == "cuda:0"
    first = report.stages["inference"][0]  # sorted by device time: the kernel's operator first
    assert first.name == "aten::mm" and first.self_device_us == pytest.approx(40.0)
    assert all(r.self_device_us == 0.0 for r in report.stages["preprocess"])
    assert report.totals["inference"].self_device_us == pytest.approx(40.0)
    text = str(report)
    assert "self device µs" in text and "ops self device ms" in text and "activities=CPU+CUDA" in text
    assert "self device µs" in report._repr_mimebundle_()["text/html"]


# --- aggregation, on stand-in events ---------------------------------------------------------------


@dataclass(eq=False)
class Ev:
    """A stand-in for torch's FunctionEvent with the fields aggregate() reads."""

    name: str
    start: float
    end: float
    parent: Ev | None = None
    self_us: float | None = None
    device_us: float = 0.0
    input_shapes: list[list[int]] = field(default_factory=list)
    device_type: str = "DeviceType.CPU"
    children: list[Ev] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.time_range = SimpleNamespace(start=self.start, end=self.end)
        self.cpu_parent = self.parent
        if self.parent is not None:
            self.parent.children.append(self)

    @property
    def cpu_time_total(self) -> float:
        return self.end - self.start

    @property
    def self_cpu_time_total(self) -> float:
        if self.self_us is not None:
            return self.self_us
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.children)

    @property
    def self_device_time_total(self) -> float:
        return self.device_us


def test_aggregate_places_ops_by_range_thread_and_time():
    made: list[Ev] = []

    def ev(*args: Any, **kwargs: Any) -> Ev:
        made.append(Ev(*args, **kwargs))
        return made[-1]

    handle = ev("handlerkit::handle", 0, 100)
    pre = ev("handlerkit::preprocess", 10, 40, handle)
    inf = ev("handlerkit::inference", 50, 90, handle)
    outer_cat = ev("aten::cat", 12, 30, pre)
    ev("aten::cat", 14, 20, outer_cat)  # nested in a cat: its total is not counted twice
    ev("aten::mm", 55, 65, inf, device_us=30.0)
    ev("aten::relu", 66, 70, inf, device_us=5.0, self_us=4.0)
    ev("aten::relu", 71, 75, inf, device_us=5.0, self_us=4.0)
    ev("aten::add", 41, 45, handle)  # between the stages: handle's
    ev("aten::decode", 20, 25)  # another thread, while preprocess was open
    ev("aten::zeros", 95, 99)  # another thread, inside handle only
    ev("aten::empty", 150, 151)  # after the run: left out
    ev("gemm_kernel", 56, 60, device_type="DeviceType.CUDA", device_us=30.0)  # counted via aten::mm

    stages, totals = aggregate(made, top=10, device_time=True)

    assert list(stages) == ["preprocess", "inference", "handle"]
    assert [(r.name, r.calls, r.cpu_total_us, r.self_cpu_us) for r in stages["preprocess"]] == [
        ("aten::cat", 2, 18, 18),
        ("aten::decode", 1, 5, 5),
    ]
    assert [(r.name, r.calls, r.self_device_us) for r in stages["inference"]] == [
        ("aten::mm", 1, 30.0),
        ("aten::relu", 2, 10.0),
    ]
    assert {r.name for r in stages["handle"]} == {"aten::add", "aten::zeros"}
    assert totals["inference"] == profile_mod.StageTotals(calls=1, cpu_us=40, self_cpu_us=18, self_device_us=40.0, operators=2)
    assert totals["handle"].cpu_us == 100 and totals["handle"].operators == 2
    cpu_only, _ = aggregate(made, top=1)  # by self CPU time when there is no device time
    assert [r.name for r in cpu_only["inference"]] == ["aten::mm"] and cpu_only["inference"][0].self_device_us is None


def test_format_shapes_drops_scalars():
    assert format_shapes(((2, 3, 8, 8), (), (4, 3, 1, 1))) == "2x3x8x8, 4x3x1x1"
    assert format_shapes(None) == "" and format_shapes(()) == ""
    assert OpStats("aten::mm", 1.0, 2.0, 1).shapes is None
