"""The Harness: stages, fidelity with handle(), errors, reload, reports."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import textwrap
import warnings

import pytest
import torch
from _strict import Strict
from _tabular import FEATURES, tabular_dir
from PIL import Image

import handlerkit as hk
from handlerkit.errors import HandlerkitError, HandlerkitWarning, StageError
from handlerkit.handlers.image_classifier import ImageClassifier

TINY_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.AvgPool2d(8), nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(torch.flatten(self.features(x), 1))
    """
)


def make_model_dir(root, name="tiny", seed=0, model_src=TINY_MODEL, labels=("red", "green", "blue"), config=None):
    import importlib.util

    model_dir = root / name
    model_dir.mkdir()
    (model_dir / "model.py").write_text(model_src)
    spec = importlib.util.spec_from_file_location(f"_tiny_{name}", model_dir / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(seed)
    torch.save(module.TinyNet().state_dict(), model_dir / "model.pt")
    if labels:
        (model_dir / "index_to_name.json").write_text(json.dumps({str(i): l for i, l in enumerate(labels)}))
    if config:
        (model_dir / "model-config.yaml").write_text(config)
    return model_dir


def png_bytes(color=(200, 30, 30), size=64):
    buf = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buf, format="PNG")
    return buf.getvalue()


def context_for(model_dir, **kwargs):
    return hk.MockContext(model_dir=str(model_dir), model_file="model.py", model_pt_file="model.pt", gpu_id=None, **kwargs)


@pytest.fixture
def model_dir(tmp_path):
    return make_model_dir(tmp_path)


@pytest.fixture
def images():
    return [hk.Request.from_bytes(png_bytes(c)) for c in [(200, 30, 30), (30, 200, 30), (30, 30, 200)]]


@pytest.fixture
def harness(model_dir):
    h = hk.Harness("image_classifier", context_for(model_dir))
    h.initialize()
    return h


# ---------------------------------------------------------------------------- construction
def test_accepts_instance_class_spec_and_function(model_dir, images):
    outputs = []
    for handler in (ImageClassifier(), ImageClassifier, "image_classifier"):
        h = hk.Harness(handler, context_for(model_dir))
        outputs.append(h.run(hk.batch(*images)).output)
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) == 3 and all(len(item) == 3 for item in outputs[0])

    seen = {}

    def handle(data, context):
        if data is None:
            seen["init"] = context
            return None
        return [len(row["body"]) for row in data]

    h = hk.Harness(handle, context_for(model_dir))
    run = h.run(hk.batch(*images))
    assert seen["init"] is h.context
    assert run.output == [len(png_bytes(c)) for c in [(200, 30, 30), (30, 200, 30), (30, 30, 200)]]
    assert list(run.stages) == ["initialize", "handle"]


def test_spec_string_from_model_dir(model_dir, images):
    (model_dir / "my_handler.py").write_text(
        "from handlerkit.handlers.image_classifier import ImageClassifier\n\n\n"
        "class Top1(ImageClassifier):\n    topk = 1\n"
    )
    h = hk.Harness("my_handler.py", context_for(model_dir))
    out = h.run(hk.batch(*images)).output
    assert type(h.handler).__name__ == "Top1"
    assert all(len(item) == 1 for item in out)


def test_rejects_non_handlers():
    with pytest.raises(TypeError, match="a spec string, a class, an instance with a handle method"):
        hk.Harness(42)


# ---------------------------------------------------------------------------- stages
def test_stage_results_carry_everything(harness, images):
    pre = harness.preprocess(hk.batch(*images))
    assert pre.ok and pre.stage == "preprocess"
    assert pre.tensors[0].shape == (3, 3, 224, 224) and pre.tensors[0].dtype == "float32"
    assert pre.tensors[0].device == "cpu" and pre.devices == ["cpu"]
    assert pre.wall_ms > 0 and pre.device_ms is None
    assert pre.cpu_peak_bytes and pre.cpu_peak_delta_bytes is not None
    assert isinstance(pre.input, list) and isinstance(pre.input[0]["body"], bytearray)
    inf = harness.inference()
    assert inf.tensors[0].shape == (3, 3)
    assert torch.equal(inf.input, pre.output)
    post = harness.postprocess()
    assert post.ok and post.problems == []
    assert list(harness.results) == ["initialize", "preprocess", "inference", "postprocess"]
    assert "preprocess" in repr(pre) and "<table" in pre._repr_mimebundle_()["text/html"] and "wall" in str(pre)


def test_rerunning_a_stage_invalidates_later_ones(harness, images):
    harness.preprocess(hk.batch(*images))
    harness.inference()
    harness.postprocess()
    harness.preprocess(hk.batch(images[0]))
    assert list(harness.results) == ["initialize", "preprocess"]
    with pytest.raises(HandlerkitError, match="needs the output of inference"):
        harness.postprocess()


def test_intermediate_can_be_replaced_by_hand(harness, images):
    harness.preprocess(hk.batch(images[0]))
    harness.inference()
    forced = torch.tensor([[0.0, 0.0, 10.0]])
    post = harness.postprocess(forced)
    assert max(post.output[0], key=post.output[0].get) == "blue"
    custom = harness.inference(torch.zeros(1, 3, 224, 224))
    assert custom.input.shape == (1, 3, 224, 224)


def test_run_equals_handle_for_handlerkit_handler(harness, images):
    batch = hk.batch(*images)
    assert harness.run(batch).output == harness.handle(batch)
    direct = ImageClassifier()
    ctx = context_for(harness.model_dir)
    direct.initialize(ctx)
    batch.bind(ctx)
    assert harness.run(batch).output == direct.handle(batch.data, ctx)


def test_run_records_handler_time_and_stage_metrics(tmp_path, images):
    model_dir = make_model_dir(tmp_path, config="handler:\n  profile: true\n")
    ctx = context_for(model_dir, model_yaml_config_file="model-config.yaml")
    h = hk.Harness("image_classifier", ctx)
    run = h.run(hk.batch(*images))
    assert [m.name for m in run.stages["preprocess"].metrics] == ["ts_handler_preprocess"]
    assert [m.name for m in run.stages["inference"].metrics] == ["ts_handler_inference"]
    assert ctx.metrics.find("HandlerTime")


def test_logs_and_warnings_are_captured_per_stage(model_dir, images):
    import logging

    class Chatty(ImageClassifier):
        def preprocess(self, data):
            logging.getLogger("chatty").info("decoding %d images", len(data))
            warnings.warn("odd image", UserWarning)
            return super().preprocess(data)

    h = hk.Harness(Chatty, context_for(model_dir))
    h.initialize()
    with pytest.warns(UserWarning, match="odd image"):  # kept in the result and shown as usual
        pre = h.preprocess(hk.batch(*images))
    assert any(e.message == "decoding 3 images" and e.logger == "chatty" for e in pre.logs)
    assert [str(w.message) for w in pre.warnings] == ["odd image"]
    assert h.inference().logs == []


# ---------------------------------------------------------------------------- errors
def test_a_bad_request_is_answered_alone_by_the_builtin(harness, images):
    bad = hk.Request.from_bytes(b"not an image at all")
    run = harness.run(hk.batch(images[0], bad, images[1]))
    assert [harness.context.get_response_status(i)[0] for i in range(3)] == [200, 400, 200]
    assert run.output[1] == {"code": 400, "error": "the 19-byte body is not an image PIL can read",
                             "fix": run.output[1]["fix"]} and run.output[1]["fix"]
    assert all("code" not in run.output[i] for i in (0, 2)) and run.problems == []


def test_bad_request_is_a_stage_error_with_the_request_index(model_dir, images):
    h = hk.Harness(Strict, context_for(model_dir))
    h.initialize()
    bad = hk.Request.from_bytes(b"not an image at all")
    with pytest.raises(StageError) as info:
        h.preprocess(hk.batch(images[0], bad, images[1]))
    err = info.value
    assert err.stage == "preprocess" and err.request_index == 1 and err.handler == "Strict"
    assert isinstance(err.__cause__, hk.RequestError)
    assert "request 1" in str(err) and "fix" in str(err)
    assert h.results["preprocess"].error is err
    # the harness keeps working
    assert h.run(hk.batch(*images)).output


def test_request_index_found_for_torchserve_style_errors(model_dir, images):
    class Plain(ImageClassifier):
        def preprocess(self, data):
            # errors without a request index, as TorchServe's handlers raise them
            return torch.stack([self.image_processing(Image.open(io.BytesIO(row["body"]))) for row in data])

    h = hk.Harness(Plain, context_for(model_dir))
    h.initialize()
    with pytest.raises(StageError) as info:
        h.preprocess(hk.batch(images[0], images[1], hk.Request.from_bytes(b"garbage")))
    assert info.value.request_index == 2
    assert "not an image" in str(info.value)  # the fix for UnidentifiedImageError


def test_inference_error_names_stage_and_keeps_state(harness, images):
    harness.preprocess(hk.batch(*images))
    pre_output = harness.results["preprocess"].output
    with pytest.raises(StageError, match="inference failed in ImageClassifier") as info:
        harness.inference(torch.zeros(2, 5))
    assert info.value.stage == "inference" and isinstance(info.value.original, IndexError)
    assert harness.results["preprocess"].output is pre_output
    assert harness.inference().ok


def test_initialize_error_is_a_stage_error(tmp_path):
    h = hk.Harness("image_classifier", context_for(tmp_path / "missing"))
    with pytest.raises(StageError) as info:
        h.initialize()
    assert info.value.stage == "initialize" and isinstance(info.value.original, hk.HandlerkitError)
    assert h.handler.initialized is False


@pytest.mark.parametrize(
    "returned, check",
    [
        ("tensor", "output-type"),
        ("dict", "output-type"),
        ("short", "output-count"),
        ("nan", "item-nan"),
        ("object", "item-serialisable"),
    ],
)
def test_bad_outputs_are_reported_with_request_and_fix(model_dir, images, returned, check):
    class Bad(ImageClassifier):
        def postprocess(self, data):
            if returned == "tensor":
                return data
            if returned == "dict":
                return {"scores": data.tolist()}
            if returned == "short":
                return data.tolist()[:1]
            if returned == "nan":
                return [[math.nan] for _ in range(len(data))]
            return [object() for _ in range(len(data))]

    h = hk.Harness(Bad, context_for(model_dir))
    h.initialize()
    with pytest.warns(HandlerkitWarning):
        run = h.run(hk.batch(*images))
    problems = run.problems
    assert problems and problems[0].check == check and problems[0].fix
    if check.startswith("item"):
        assert problems[0].request_index == 0
    report = h.check(hk.batch(*images))
    assert not report.ok and any(p.check == check for p in report.problems)


# ---------------------------------------------------------------------------- routing
def test_describe_and_explain_go_where_torchserve_sends_them(harness, images):
    described = hk.batch(images[0].with_headers(describe="True"))
    run = harness.run(described)
    assert run.mode == "describe" and run.output == [None] == harness.handle(described)
    explained = hk.batch(images[0].with_headers(explain="True"))
    run = harness.run(explained)
    assert run.mode == "explain" and list(run.stages) == ["initialize", "preprocess", "explain"]
    attributions = torch.tensor(run.output)
    assert attributions.shape == (1, 3, 224, 224)
    assert torch.allclose(attributions, torch.tensor(harness.handle(explained)), atol=1e-5)


def test_handle_override_that_skips_stages_is_detected(model_dir, images):
    class Shortcut(ImageClassifier):
        def handle(self, data, context):
            return ["fixed"] * len(data)

    h = hk.Harness(Shortcut, context_for(model_dir))
    assert h.single_stage
    with pytest.warns(HandlerkitWarning, match="never called preprocess"):
        run = h.run(hk.batch(*images))
    assert list(run.stages) == ["initialize", "handle"] and run.output == ["fixed"] * 3 and run.mode == "handle"
    (problem,) = run.stages["handle"].problems
    assert problem.check == "skipped-stages" and problem.fix.startswith("call them from handle()")
    assert "contract problems" in str(run) and "never called preprocess" in run._html()  # in the run's table (its text wraps)


def test_handle_override_that_calls_stages_is_not_flagged(model_dir, images):
    class Wrapped(ImageClassifier):
        def handle(self, data, context):
            return super().handle(data, context)

    h = hk.Harness(Wrapped, context_for(model_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)
        run = h.run(hk.batch(*images))
    # run() goes through the override, as the worker does, and reports the stages it called
    assert list(run.stages) == ["initialize", "preprocess", "inference", "postprocess"] and run.mode == "stages"
    assert run.output == h.handle(hk.batch(*images)) and not run.problems


# ---------------------------------------------------------------------------- model dirs
def test_several_model_dirs_in_one_process_with_torchserve_handlers(tmp_path, images):
    ts_base = pytest.importorskip("ts.torch_handler.base_handler")

    scaled = TINY_MODEL.replace("return self.fc(", "return 1000 * self.fc(")
    dir_a = make_model_dir(tmp_path, "a", model_src=TINY_MODEL)
    dir_b = make_model_dir(tmp_path, "b", model_src=scaled)

    class Handler(ts_base.BaseHandler):
        def preprocess(self, data):
            return torch.zeros(1, 3, 64, 64)

    outs = []
    for d in (dir_a, dir_b, dir_a):
        h = hk.Harness(Handler(), context_for(d))
        outs.append(h.run(hk.batch(images[0])).output)
    assert outs[0] == outs[2]
    assert outs[1] != outs[0]


# ---------------------------------------------------------------------------- reports
def test_time_and_sweep_report_per_stage(harness, images):
    report = harness.time(hk.batch(*images), warmup=1, repeat=3)
    assert set(report.stages) == {"preprocess", "inference", "postprocess"}
    assert report.stages["inference"].n == 3 and report.batch_size == 3
    assert "median" in str(report) and "<table" in report._repr_mimebundle_()["text/html"]
    sweep = harness.sweep(hk.batch(images[0]), batch_sizes=(1, 2), warmup=0, repeat=2)
    assert [row["batch_size"] for row in sweep.rows] == [1, 2]
    assert all(row["throughput_rps"] > 0 for row in sweep.rows)


def test_device_report(harness, images):
    harness.run(hk.batch(*images))
    report = harness.device_report()
    assert report.device == "cpu" and "no accelerator" in report.reason
    assert set(report.available) == {"cuda", "xpu", "mps", "xla"}
    assert report.placement["parameters"] == {"cpu float32": sum(p.numel() for p in harness.handler.model.parameters())}
    assert report.stage_devices["inference"] == ["cpu"]
    assert report.copies == [] and report.warnings == []
    assert repr(report) == "<DeviceReport device report of ImageClassifier: cpu>"
    assert "<table" in report._repr_mimebundle_()["text/html"]


def test_device_report_flags_copies_and_mixed_devices(model_dir, images):
    class Leaky(ImageClassifier):
        def inference(self, data, *args, **kwargs):
            data.to("meta")  # a stray copy to another device inside inference
            return super().inference(data)

    h = hk.Harness(Leaky, context_for(model_dir))
    h.initialize()
    h.handler.model.fc.register_buffer("stray", torch.zeros(2, device="meta"))
    h.preprocess(hk.batch(images[0]))
    h.inference()
    report = h.device_report()
    assert any("cpu -> meta" in c for c in report.copies)
    assert any("spread over" in w for w in report.warnings)


def test_check_passes_for_a_good_handler(harness, images):
    before = harness.preprocess(hk.batch(images[0]))
    report = harness.check(hk.batch(*images))
    assert report.ok, report
    assert [p[1] for p in report.parity] == ["same alone and in the batch"] * 3
    outcomes = {variant: outcome for _, variant, outcome in report.encodings}
    assert outcomes["field 'data' instead of 'body'"] == "same output"
    assert outcomes["bytes instead of bytearray"] == "same output"
    assert outcomes["base64 str (JSON clients)"] == "same output"
    # the harness's own state is untouched by the checks
    assert harness.results["preprocess"] is before and len(harness.batch) == 1


def test_check_finds_batch_dependent_outputs(model_dir, images):
    class BatchNormalised(ImageClassifier):
        def inference(self, data, *args, **kwargs):
            out = super().inference(data)
            return out - out.mean(dim=0, keepdim=True)  # depends on the other requests

    h = hk.Harness(BatchNormalised, context_for(model_dir))
    report = h.check(hk.batch(*images))
    assert not report.ok
    assert any(p.check == "batch-parity" for p in report.problems)


def test_check_finds_reordered_outputs(model_dir, images):
    class Reversed(ImageClassifier):
        def postprocess(self, data):
            return super().postprocess(data)[::-1]

    h = hk.Harness(Reversed, context_for(model_dir))
    report = h.check(hk.batch(*images))
    assert any("wrong order" in p.message for p in report.problems)


# ---------------------------------------------------------------------------- reload
def test_reload_rebinds_methods_without_reinitialising(model_dir, images):
    source = model_dir / "reloadable.py"
    source.write_text(
        "from handlerkit.handlers.image_classifier import ImageClassifier\n\n\n"
        "class Reloadable(ImageClassifier):\n"
        "    def postprocess(self, data):\n"
        "        return ['v1'] * len(data)\n"
    )
    h = hk.Harness("reloadable.py", context_for(model_dir))
    assert h.run(hk.batch(*images)).output == ["v1"] * 3
    model = h.handler.model
    init_result = h.results["initialize"]
    source.write_text(source.read_text().replace("'v1'", "'v2'"))
    h.reload()
    assert h.handler.model is model and h.results["initialize"] is init_result
    assert h.run(hk.batch(*images)).output == ["v2"] * 3
    # a broken edit keeps the previous code
    source.write_text("def broken(:\n")
    with pytest.raises(StageError, match="reload"):
        h.reload()
    assert h.run(hk.batch(*images)).output == ["v2"] * 3


def test_torchserve_handler_initializes_twice_with_a_compile_config(model_dir, images):
    ts_base = pytest.importorskip("ts.torch_handler.base_handler")

    class Handler(ts_base.BaseHandler):
        def preprocess(self, data):
            return torch.zeros(1, 3, 64, 64)

    config = {"pt2": {"compile": {"enable": True, "backend": "eager"}}}
    h = hk.Harness(Handler(), context_for(model_dir, model_yaml_config=config))
    first = h.run(hk.batch(images[0])).output
    h.initialize()  # TorchServe deleted "enable" from the dict it was given; we hand a fresh copy
    assert isinstance(h.handler.model, torch._dynamo.eval_frame.OptimizedModule)
    assert h.run(hk.batch(images[0])).output == first
    assert config == {"pt2": {"compile": {"enable": True, "backend": "eager"}}}


def test_torchserve_image_classifier_runs_unchanged(tmp_path, images):
    ts_classifier = pytest.importorskip("ts.torch_handler.image_classifier")
    five = TINY_MODEL.replace("nn.Linear(4, 3)", "nn.Linear(4, 5)")
    model_dir = make_model_dir(tmp_path, "five", model_src=five, labels=("a", "b", "c", "d", "e"))
    batch = hk.batch(*images)

    theirs = hk.Harness(ts_classifier.ImageClassifier(), context_for(model_dir))
    run = theirs.run(batch)
    assert run.output == theirs.handle(batch)
    assert list(run.stages) == ["initialize", "preprocess", "inference", "postprocess"]
    assert all(set(item) == {"a", "b", "c", "d", "e"} for item in run.output)
    report = theirs.device_report()  # TorchServe's handler records no decisions: derived instead
    assert report.device == "cpu" and report.reason == "chosen by the handler (it does not record why)"
    assert report.stage_devices["inference"] == ["cpu"] and report.warnings == []

    ours = hk.Harness("image_classifier", context_for(model_dir))
    for mine, reference in zip(ours.run(batch).output, run.output):
        assert mine.keys() == reference.keys()
        assert all(abs(mine[k] - reference[k]) < 1e-6 for k in mine)


def test_function_handler_run_equals_its_handle(model_dir, images):
    state = {}

    def handle(data, context):
        if data is None:
            state["ready"] = True
            return None
        return [{"bytes": len(row["body"]), "id": context.get_request_id(i)} for i, row in enumerate(data)]

    h = hk.Harness(handle, context_for(model_dir))
    batch = hk.batch(*images)
    assert h.run(batch).output == h.handle(batch) == handle(batch.data, h.context)
    assert state["ready"]
    with pytest.raises(HandlerkitError, match="function handler"):
        h.preprocess(batch)


def test_reload_runs_the_new_source_even_within_the_same_second(model_dir, images):
    # A .pyc is validated by mtime (whole seconds) and size: same-size edits within a second
    # would run stale bytecode if reload went through the bytecode cache.
    source = model_dir / "same_size.py"
    template = (
        "from handlerkit.handlers.image_classifier import ImageClassifier\n\n\n"
        "class SameSize(ImageClassifier):\n"
        "    def postprocess(self, data):\n"
        "        return ['{}'] * len(data)\n"
    )
    source.write_text(template.format("a"))
    h = hk.Harness("same_size.py", context_for(model_dir))
    h.initialize()
    stamp = os.stat(source).st_mtime_ns
    for version in "bcd":
        source.write_text(template.format(version))
        os.utime(source, ns=(stamp, stamp))
        h.reload()
        assert h.run(hk.batch(images[0])).output == [version]


def test_device_report_gpu_facts_with_faked_cuda(harness, images, monkeypatch):
    from types import SimpleNamespace

    import handlerkit.worker.devices as device_mod

    harness.run(hk.batch(images[0]))
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=141 * 2**30)
    )
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 4 * 2**20)
    harness.handler.device = torch.device("cuda:0")  # the model stays on the CPU: a mismatch
    report = harness.device_report()
    assert report.gpu == {
        "name": "NVIDIA H200",
        "capability": "9.0",
        "total_memory": 141 * 2**30,
        "allocated": 3 * 2**20,
        "reserved": 4 * 2**20,
    }
    assert any("the model lives on ['cpu']" in w for w in report.warnings)
    assert "gpu name" in str(report) and "NVIDIA H200" in report._repr_mimebundle_()["text/html"]


def test_run_makes_no_syscall_for_the_model_dir(harness, images, monkeypatch):
    # Between two bursts of torch work a stat costs several microseconds: a loop of runs
    # (time(), sweep(), the overhead benchmark) must not pay it on every run.
    from handlerkit.worker import isolation

    batch = hk.batch(images[0])
    harness.run(batch)
    monkeypatch.setattr(harness.service.sources, "changed", list)  # its look a second: test_freshness.py
    calls = []
    real_stat, real_isdir = os.stat, os.path.isdir
    monkeypatch.setattr(isolation.os, "stat", lambda *a, **k: calls.append(a) or real_stat(*a, **k))
    monkeypatch.setattr(os.path, "isdir", lambda p: calls.append(p) or real_isdir(p))
    for _ in range(3):
        run = harness.run(batch)
    assert calls == []
    assert run.output == harness.handle(batch)


def test_initialize_sees_a_file_added_to_the_model_dir_at_once(tmp_path, monkeypatch):
    # run() trusts the dir's listing for a second; initialize must not, or a file added just
    # now whose name is also imported elsewhere would give the handler the wrong module.
    import sys
    import types

    model_dir = tmp_path / "md"
    model_dir.mkdir()
    (model_dir / "handler.py").write_text(
        textwrap.dedent(
            """
            class Handler:
                def initialize(self, context):
                    try:
                        import extra
                    except ImportError:
                        extra = None
                    self.who = getattr(extra, "WHO", None)
                    self.initialized = True

                def handle(self, data, context):
                    return [self.who for _ in data]
            """
        )
    )
    h = hk.Harness("handler", hk.MockContext(model_dir=str(model_dir), gpu_id=None))
    h.initialize()
    assert h.run({"data": b"x"}).output == [None]
    notebook_extra = types.ModuleType("extra")
    notebook_extra.WHO = "the notebook's extra"
    monkeypatch.setitem(sys.modules, "extra", notebook_extra)
    (model_dir / "extra.py").write_text("WHO = 'the model dir extra'\n")
    os.utime(model_dir, ns=(0, os.stat(model_dir).st_mtime_ns + 10**9))
    h.initialize()
    assert h.handler.who == "the model dir extra"
    assert sys.modules["extra"] is notebook_extra


def test_a_plain_handle_only_class_is_not_flagged(tmp_path):
    class OnlyHandle:  # no BaseHandler, no stages: nothing is skipped
        def initialize(self, context):
            self.initialized = True

        def handle(self, data, context):
            return ["ok" for _ in data]

    h = hk.Harness(OnlyHandle(), hk.MockContext(model_dir=str(tmp_path), gpu_id=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)
        run = h.run({"data": b"x"})
    assert run.output == ["ok"] and run.mode == "handle" and run.problems == []


def test_a_run_failing_midway_keeps_the_stages_before_and_attributes_records(model_dir, images):
    class Flaky(ImageClassifier):
        fail = True

        def preprocess(self, data):
            warnings.warn("from preprocess")
            self.context.metrics.add_counter("PreCount", 1)
            return super().preprocess(data)

        def inference(self, data, *args, **kwargs):
            logging.getLogger("flaky").warning("from inference")
            if self.fail:
                raise RuntimeError("inference broke")
            return super().inference(data, *args, **kwargs)

    h = hk.Harness(Flaky(), context_for(model_dir))
    batch = hk.batch(*images[:2])
    with pytest.warns(UserWarning, match="from preprocess"), pytest.raises(StageError, match="inference broke") as info:
        h.run(batch)
    assert info.value.stage == "inference"
    assert set(h.results) == {"initialize", "preprocess", "inference"}
    pre, inf = h.results["preprocess"], h.results["inference"]
    assert pre.ok and not inf.ok and inf.output is None and inf.input is pre.output
    assert [str(w.message) for w in pre.warnings] == ["from preprocess"] and inf.warnings == []
    assert [m.name for m in pre.metrics] == ["PreCount"] and inf.metrics == []
    assert [e.message for e in inf.logs] == ["from inference"] and pre.logs == []
    h.handler.fail = False  # fix the code, run again: the harness is still usable
    with pytest.warns(UserWarning, match="from preprocess"):
        run = h.run(batch)
        assert run.output == h.handle(batch)
    assert set(h.results) == {"initialize", "preprocess", "inference", "postprocess"}


# -------------------------------------------------------------------- envelopes, request names
class Instances(hk.BaseHandler):
    """Reads the json envelope's instances: ``{"features": [4 floats]}`` each."""

    def preprocess(self, data):
        return torch.tensor([instance["features"] for instance in data], dtype=torch.float32)

    def postprocess(self, scores):
        return scores.argmax(dim=1).tolist()


def test_stepping_under_an_envelope_agrees_with_run(tmp_path):
    from handlerkit.worker.clients import request

    ctx = hk.MockContext.from_model_dir(tabular_dir(tmp_path / "tabular", base="handlerkit"))
    h = hk.Harness(Instances, ctx, envelope="json")
    rows = [{"features": FEATURES}, {"features": FEATURES[::-1]}, {"features": [1.0, 1.0, 1.0, 1.0]}]
    batch = hk.batch(request("json", rows[:2]), request("json", rows[2:]))  # two requests, three instances
    run = h.run(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # no "got 3 item(s) for a batch of 2"
        assert tuple(h.preprocess(batch).output.shape) == (3, 4)  # the envelope's instances
        h.inference()
        stepped = h.postprocess()
    assert stepped.output == run.output and stepped.problems == []
    assert [len(json.loads(answer)["predictions"]) for answer in stepped.output] == [2, 1]

    h.handler.postprocess = lambda scores: [0]  # one prediction for three instances
    with pytest.raises(StageError, match=r"^postprocess failed in Instances for the batch: .*one item per instance: got 1 items for 3"):
        h.postprocess(run.stages["inference"].output)


def test_errors_name_a_request_by_the_name_the_harness_was_given(tmp_path):
    h = hk.Harness.open(tabular_dir(tmp_path / "tabular", base="handlerkit"))
    good, misspelt = hk.Request.json({"features": FEATURES}), hk.Request.json({"feature": FEATURES})
    h.request_names[misspelt.request_id] = "misspelt.json"
    with pytest.raises(StageError, match=r"^preprocess failed in TabularHandler for misspelt.json: KeyError") as info:
        h.run([good, misspelt])
    assert info.value.request_index == 1
    assert info.value.fix.startswith("the client's payload lacks the key 'features' (did you mean 'feature'?): "
                                     "misspelt.json sent a JSON object with 'feature'")


# -------------------------------------------------------------------- a failed run is a Run too
def test_a_failed_run_replaces_the_last_run_with_its_error_and_the_stages_that_ran(tmp_path):
    from _new_users import RANKER_ITEMS, ranker_dir, ranker_request

    h = hk.Harness.open(ranker_dir(tmp_path / "recs"))
    good = h.run(hk.batch(hk.Request.json(ranker_request(1, [1, 2, 3])), hk.Request.json(ranker_request(2, [4]))))
    assert h.last_run is good and good.error is None and good.ok
    bad = hk.batch(hk.Request.json(ranker_request(1, [1, 2])), hk.Request.json(ranker_request(2, [RANKER_ITEMS + 59])))
    with pytest.raises(StageError, match="index out of range in self") as info:
        h.run(bad)
    failed = h.last_run
    assert failed is not good and failed.error is info.value and not failed.ok
    assert failed.output is None and failed.batch_size == 2 and failed.mode == "stages"
    assert list(failed.stages) == ["initialize", "preprocess", "inference"]
    inference = failed.stages["inference"]
    assert inference.error is info.value and inference.input is failed.stages["preprocess"].output
    assert inference.input[1].tolist() == [[1, 2], [99, 0]]  # what it failed on, kept
    # It says so before anything else, in the one line and in the tables.
    first_line = info.value.message.splitlines()[0]
    assert repr(failed) == f"<Run {failed._summary()}>" and failed._summary().endswith(f", FAILED: {first_line}")
    text = str(failed).split("\n\n")
    assert text[1].startswith("the run failed: handle raised, so there is no output\nerror      " + first_line)
    assert "its input  h.last_run.stages['inference'].input: what inference failed on" in text[1]
    assert "inference       1" in text[2] and "raised IndexError" in text[2]
    assert h.run(hk.batch(hk.Request.json(ranker_request(3, [5])))).ok and h.last_run.error is None  # usable


def test_a_run_whose_initialize_fails_leaves_no_last_run_and_the_error_on_initialize(tmp_path):
    from _new_users import audio_dir, wav_bytes

    model_dir = audio_dir(tmp_path / "sounds")
    h = hk.Harness.open(model_dir)
    tone = hk.batch(hk.Request.from_bytes(wav_bytes(), "audio/wav"))
    h.run(tone)
    (model_dir / "model.pt").write_bytes(b"not weights")
    with pytest.raises(StageError) as info:
        h.initialize()
    with pytest.raises(StageError) as again:
        h.run(tone)  # initialize failed last: the run tries it again first
    assert info.value.stage == again.value.stage == "initialize"
    assert h.last_run is None and h.results["initialize"].error is again.value  # not the first run's


def test_a_streaming_run_failing_after_its_chunks_keeps_them_in_the_failed_run(tmp_path):
    from _new_users import char_stream_dir

    model_dir = char_stream_dir(tmp_path / "chars")
    handler = model_dir / "handler.py"
    source = handler.read_text()
    old = "    def postprocess(self, texts):\n        return texts\n"
    assert old in source
    handler.write_text(source.replace(old, "    def postprocess(self, texts):\n        return [t + self.suffix for t in texts]\n"))
    h = hk.Harness.open(model_dir)
    prompts = hk.batch(hk.Request.text("hello"), hk.Request.text("abc"))
    chunks = []
    with pytest.raises(StageError, match="postprocess failed in CharStreamHandler.*AttributeError") as info:
        for chunk in h.stream(prompts):
            chunks.append(chunk)
    run = h.last_run
    assert run is not None and run.error is info.value and run.output is None
    assert run.chunks == chunks and len(chunks) == 16  # 8 characters for each of the two prompts, all sent
    assert [s.index for s in run.streams] == [0, 1] and all(len(s.chunks) == 8 for s in run.streams)
    assert all(s.final_ms is None for s in run.streams)  # no final answer ended them
    texts = run.stages["postprocess"].input  # what postprocess failed on: the whole texts
    assert ["".join(c.text for c in s.chunks) for s in run.streams] == texts
    assert "16 chunk(s)" in repr(run) and ", FAILED: postprocess failed" in repr(run)


def test_a_run_lists_initialize_only_when_it_ran_in_it(tmp_path):
    """h.run initializes first only when initialize has not succeeded: a later run's table
    shows the stages it ran, not the initialize it used (notebook 01's Run table)."""
    from _new_users import ranker_dir, ranker_request

    h = hk.Harness.open(ranker_dir(tmp_path / "recs"))
    batch = hk.batch(hk.Request.json(ranker_request(1, [3, 5])))
    first = h.run(batch)  # initializes first: part of this run
    second = h.run(batch)  # on the model the first loaded
    assert first.initialized and list(first.ran) == ["initialize", "preprocess", "inference", "postprocess"]
    assert not second.initialized and list(second.ran) == ["preprocess", "inference", "postprocess"]
    assert second.stages["initialize"] is first.stages["initialize"]  # the one it used, still at hand
    rows = lambda run: [line.split()[0] for line in str(run).splitlines() if line.strip()]  # each line's first word
    assert "initialize" in rows(first) and "initialize" not in rows(second)
    assert ">initialize<" in first._repr_mimebundle_()["text/html"]
    assert ">initialize<" not in second._repr_mimebundle_()["text/html"]
    with pytest.raises(StageError, match="inference failed"):
        h.run(hk.batch(hk.Request.json(ranker_request(1, [45]))))  # an item id the embedding has not
    assert not h.last_run.initialized and "initialize" not in rows(h.last_run)
