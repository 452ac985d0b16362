"""handlerkit.recording.results: what the harness keeps, a StageResult per stage and a Run per batch, and how
they render (one-line repr, tables in str, HTML in Jupyter), built here by hand and from a real run."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from handlerkit.errors import StageError
from handlerkit.recording import results
from handlerkit.recording.results import LogEntry, Run, StageResult, TensorInfo
from handlerkit.worker.contract import Problem

ROOT = Path(__file__).resolve().parents[2]
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"


def everything() -> StageResult:
    """A stage that ran twice on a device and recorded one of each kind of record."""
    return StageResult(
        "inference",
        input=torch.zeros(2, 3),
        output=[torch.ones(2), {"k": torch.zeros(1, dtype=torch.int64)}],
        wall_ms=3.14159,
        device_ms=2.5,
        cpu_peak_delta_bytes=2048,
        cuda_peak_bytes=1 << 20,
        logs=[LogEntry("INFO", "handler", "loaded")],
        warnings=[warnings.WarningMessage(UserWarning("slow"), UserWarning, "handler.py", 3)],
        metrics=[SimpleNamespace(name="HandlerTime", value=1.5, unit="ms")],
        problems=[Problem("output-type", "not a list", "return a list", "inference", 1)],
        calls=2,
    )


# ---------------------------------------------------------------------------------------------
# StageResult
# ---------------------------------------------------------------------------------------------


def test_a_stage_result_knows_its_tensors_and_their_devices():
    r = everything()
    assert r.ok and r.error is None
    assert r.tensors == [TensorInfo("[0]", (2,), "float32", "cpu"), TensorInfo("[1]['k']", (1,), "int64", "cpu")]
    assert r.input_tensors == [TensorInfo("<value>", (2, 3), "float32", "cpu")]
    assert r.devices == ["cpu"]
    meta = StageResult("preprocess", input=torch.zeros(1, device="meta"), output=torch.zeros(1))
    assert meta.devices == ["cpu", "meta"]  # input and output together, sorted
    assert StageResult("postprocess", output=["a"]).tensors == [] and StageResult("x").devices == []


def test_the_tensors_are_found_once_on_first_access(monkeypatch):
    calls = []
    real = results.tensor_infos
    monkeypatch.setattr(results, "tensor_infos", lambda value: calls.append(value) or real(value))
    r = StageResult("inference", output=torch.zeros(2))
    assert calls == []  # nothing is computed when the result is made
    assert r.tensors is r.tensors and r.input_tensors is r.input_tensors
    assert len(calls) == 2  # one for the output, one for the input


def unwrapped(text: str) -> str:
    """A table's text with each wrapped cell's continuation lines joined back onto its row."""
    return re.sub(r"\n {4,}", " ", text)


def test_device_time_where_the_device_was_timed_else_wall_time():
    assert StageResult("inference", wall_ms=9.0, device_ms=7.5).device_or_wall_ms == 7.5
    assert StageResult("inference", wall_ms=9.0).device_or_wall_ms == 9.0
    assert StageResult("inference", wall_ms=9.0, device_ms=0.0).device_or_wall_ms == 0.0  # zero is a time


def test_repr_is_one_line_and_str_has_a_row_for_each_record():
    r = everything()
    assert repr(r) == "<StageResult inference ok 2 calls 3.14 ms output=list[2] of Tensor[2] float32 cpu>"
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in unwrapped(str(r)).splitlines()[2:])
    assert rows == {
        "status": "ok",
        "calls": "2",
        "wall": "3.14 ms",
        "device time": "2.50 ms",
        "peak memory (CPU, above start)": "2.0 KiB",
        "peak memory (CUDA)": "1.0 MiB",
        "output": "list[2] of Tensor[2] float32 cpu",
        "output[0]": "Tensor[2] float32 cpu n=2 (8 B) min=1 max=1 mean=1 std=0",
        "output[1]['k']": "Tensor[1] int64 cpu n=1 (8 B) min=0 max=0 mean=0 all zeros",
        "input": "Tensor[2, 3] float32 cpu n=6 (24 B) min=0 max=0 mean=0 std=0 all zeros",
        "warning": "UserWarning: slow",
        "log": "INFO handler: loaded",
        "metric": "HandlerTime = 1.5 ms",
        "problem": "inference: request 1: not a list; fix: return a list",
    }
    html = r._repr_mimebundle_()["text/html"]
    assert ">peak memory (CUDA)</td>" in html and "inference: request 1: not a list" in html


def test_a_plain_stage_shows_only_what_it_has():
    lines = str(StageResult("preprocess", input=[{"body": b"x"}], output=torch.zeros(1, 2), wall_ms=1.0)).splitlines()
    assert lines[0] == "preprocess ok 1.00 ms output=Tensor[1, 2] float32 cpu"
    assert [line.split("  ")[0] for line in lines[2:]] == ["status", "wall", "output"]  # no row for absent records


def test_records_are_shown_five_at_most():
    logs = [LogEntry("INFO", "h", f"line {i}") for i in range(7)]
    text = str(StageResult("preprocess", logs=logs))
    assert [line for line in text.splitlines() if line.startswith("log ")][-1].endswith("INFO h: line 4")
    assert "line 5" not in text


def test_a_failed_stage_names_the_exception_it_raised():
    error = StageError("preprocess failed on request 1: bad image", stage="preprocess", original=ValueError("bad image"))
    failed = StageResult("preprocess", error=error, wall_ms=0.5)
    assert not failed.ok
    assert repr(failed) == "<StageResult preprocess error=ValueError 0.50 ms output=None>"
    assert "status  error: preprocess failed on request 1: bad image" in str(failed)
    bare = StageResult("handle", error=StageError("handle returned nothing", stage="handle"))
    assert repr(bare).startswith("<StageResult handle error=StageError ")


# ---------------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------------


def a_run(**kwargs) -> Run:
    stages = {
        "initialize": StageResult("initialize", wall_ms=100.0),
        "preprocess": StageResult("preprocess", output=torch.zeros(1, 2), wall_ms=1.0),
        "inference": everything(),
    }
    return Run(output=["a"], stages=stages, batch_size=1, **kwargs)


def test_a_run_times_its_stages_without_initialize_unless_handle_was_timed():
    run = a_run()
    assert run.timings == {"initialize": 100.0, "preprocess": 1.0, "inference": 3.14159}
    assert run.total_ms == pytest.approx(4.14159)
    assert a_run(handle_ms=5.0).total_ms == 5.0  # handle's own time: the stages and what it did around them
    assert run.mode == "stages" and run.source is None


def test_a_run_gathers_the_problems_of_its_stages():
    run = a_run()
    assert [p.message for p in run.problems] == ["not a list"]
    assert repr(run) == "<Run Run of 1 request(s), 4.14 ms, 1 problem(s)>"
    assert repr(Run(output=[], stages={}, batch_size=2)) == "<Run Run of 2 request(s), 0.00 ms>"


def test_a_run_prints_a_row_per_stage_then_the_tensors_inside_outputs_then_the_problems():
    text = str(a_run())
    tables = text.split("\n\n")
    assert tables[0] == "Run of 1 request(s), 4.14 ms, 1 problem(s)"
    assert re.search(r"^initialize +1 +100 +None *$", tables[1], re.M)
    assert re.search(r"^preprocess +1 +1\.00 +Tensor\[1, 2\] float32 cpu n=2 .* all zeros$", tables[1], re.M)
    assert re.search(r"^inference +2 +3\.14 +list\[2\] of Tensor\[2\] float32 cpu$", tables[1], re.M)
    assert tables[2].splitlines()[0] == "tensors in the outputs"
    assert re.search(r"^inference +output\[1\]\['k'\] +Tensor\[1\] int64 cpu", tables[2], re.M)
    assert tables[3].splitlines()[0] == "contract problems"
    assert re.search(r"^error +inference +1 +not a list +return a list$", tables[3], re.M)
    bundle = a_run()._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert "contract problems" in bundle["text/html"] and ">not a list</td>" in bundle["text/html"]


# ---------------------------------------------------------------------------------------------
# From a real run: the tables print each tensor's summary, computed when rendered only
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier_run():
    import handlerkit as hk

    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(str(CLASSIFIER)))
    return h.run(hk.batch(*(hk.Request.from_file(str(IMAGES / name)) for name in ("circle.png", "star.jpg"))))


def test_stage_tables_print_the_summary_of_each_tensor(classifier_run):
    inference = unwrapped(str(classifier_run.stages["inference"]))
    output = next(line for line in inference.splitlines() if line.startswith("output "))
    assert "Tensor[2, 5] float32 cpu n=10 (40 B) min=" in output and "std=" in output
    assert re.search(r"^input +Tensor\[2, 3, 224, 224\] float32 cpu n=301056 \(1.1 MiB\) min=", inference, re.M)
    preprocess = str(classifier_run.stages["preprocess"])
    assert "input " not in preprocess  # the requests hold no tensor: no row for them


def test_run_table_prints_summaries_and_a_table_for_tensors_inside_outputs(classifier_run):
    text = unwrapped(str(classifier_run))
    assert re.search(r"^preprocess .* Tensor\[2, 3, 224, 224\] float32 cpu n=301056 .* mean=", text, re.M)
    nested = StageResult("inference", output=[{"boxes": torch.zeros(1, 4), "scores": torch.ones(1)}])
    run = Run(output=[], stages={"inference": nested}, batch_size=1)
    lines = unwrapped(str(run)).splitlines()
    assert "tensors in the outputs" in lines
    assert any(re.match(r"inference +output\[0\]\['boxes'\] +Tensor\[1, 4\] .* all zeros", line) for line in lines)
    assert "output[0]['scores']" in str(nested) and "Tensor[1] float32 cpu n=1 (4 B) min=1" in unwrapped(str(nested))


def test_summaries_are_computed_when_printed_never_during_a_run(monkeypatch):
    import handlerkit as hk
    import handlerkit.summaries as module

    calls = []
    real = module._statistics
    monkeypatch.setattr(module, "_statistics", lambda t: (calls.append(t.shape), real(t))[1])
    h = hk.Harness("image_classifier", hk.MockContext.from_model_dir(str(CLASSIFIER)))
    run = h.run(hk.batch(hk.Request.from_file(str(IMAGES / "circle.png"))))
    repr(run), repr(run.stages["inference"])  # the one-line reprs stay cheap too
    assert calls == []
    str(run)
    assert torch.Size([1, 3, 224, 224]) in calls


def test_a_run_is_ok_when_no_problem_is_an_error():
    assert not a_run().ok  # "not a list": TorchServe would answer 503
    fine = Run(output=["a"], stages={"postprocess": StageResult("postprocess", output=["a"])}, batch_size=1)
    assert fine.ok
    warned = StageResult("postprocess", output=["a"], problems=[Problem("slow", "took long", "", "postprocess", severity="warning")])
    assert Run(output=["a"], stages={"postprocess": warned}, batch_size=1).ok


def test_a_failed_run_says_so_first_with_where_and_the_fix_and_is_not_ok():
    error = StageError(
        "inference failed in RecsHandler for request 1: IndexError: index out of range in self\n"
        "  at /m/model.py:13: items = self.items(item_ids)",
        stage="inference", request_index=1, original=IndexError("index out of range in self"),
        fix="validate the item ids in preprocess", location=("/m/model.py", 13, "items = self.items(item_ids)"),
    )
    stages = {
        "initialize": StageResult("initialize", wall_ms=100.0),
        "preprocess": StageResult("preprocess", output=torch.zeros(2, 3, dtype=torch.long), wall_ms=1.0),
        "inference": StageResult("inference", input=torch.zeros(2, 3, dtype=torch.long), error=error, wall_ms=0.5),
    }
    run = Run(None, stages, 2, "stages", 1.75, None, [], [], error)  # positionally, as before, the error last
    assert not run.ok and run.output is None
    assert repr(run) == (
        "<Run Run of 2 request(s), 1.75 ms, FAILED: "
        "inference failed in RecsHandler for request 1: IndexError: index out of range in self>"
    )
    tables = str(run).split("\n\n")
    assert tables[1].splitlines() == [
        "the run failed: handle raised, so there is no output",
        "error      inference failed in RecsHandler for request 1: IndexError: index out of range in self",
        "at         /m/model.py:13: items = self.items(item_ids)",
        "fix        validate the item ids in preprocess",
        "its input  h.last_run.stages['inference'].input: what inference failed on",
    ]
    assert re.search(r"^inference +1 +0\.500 +raised IndexError$", tables[2], re.M)
    assert "the run failed" in run._repr_mimebundle_()["text/html"]
    assert a_run().error is None and a_run().ok is False  # a run that returned keeps its meaning
