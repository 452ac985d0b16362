"""hk.Stepper: buttons drive the same Harness (``h.results`` holds what they produced), panes
show results, errors with their fix, logs and warnings; uploads, reset and run-all.

Buttons are clicked with ``Button.click()``, which runs the same callbacks a browser click
does (tests/integration/test_browser.py clicks one in real JupyterLab).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _strict import Strict

import handlerkit as hk
from handlerkit._render import Rendered, Table
from handlerkit.handlers.image_classifier import ImageClassifier
from handlerkit.widgets import Stepper
from handlerkit.widgets.panes import output_text

pytest.importorskip("ipywidgets")

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
BAD = ROOT / "fixtures" / "bad"
LATER = ("preprocess", "inference", "postprocess")


def harness(handler=None) -> hk.Harness:
    return hk.Harness(handler or "image_classifier", hk.MockContext.from_model_dir(MODEL_DIR))


def image(name: str) -> hk.Request:
    return hk.Request.from_file(IMAGES / name)


def pane(stepper: Stepper, stage: str) -> str:
    text = stepper.text(stage)
    assert text == output_text([*stepper.outputs[stage].outputs, *stepper.picture_outputs[stage].outputs])
    return text


def enabled(stepper: Stepper) -> dict[str, bool]:
    return {stage: not button.disabled for stage, button in stepper.buttons.items()}


def upload_file(name: str, content: bytes, content_type: str) -> dict:
    return {"name": name, "type": content_type, "size": len(content), "content": memoryview(content),
            "last_modified": datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)}


def test_buttons_are_enabled_in_order_and_drive_the_harness():
    h = harness()
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    assert enabled(stepper) == {"initialize": True, "preprocess": False, "inference": False, "postprocess": False}
    assert stepper.batch_size.value == "batch: 1 request"

    stepper.buttons["initialize"].click()
    assert h.results["initialize"].ok
    assert enabled(stepper) == {"initialize": True, "preprocess": True, "inference": False, "postprocess": False}
    assert "device report of ImageClassifier" in output_text(stepper.device_output.outputs)
    assert "no pt2 section" in stepper.compile_decision.value  # h.handler.decisions.compile

    stepper.buttons["preprocess"].click()
    result = h.results["preprocess"]
    assert tuple(result.output.shape) == (1, 3, 224, 224)
    assert enabled(stepper)["inference"] and not enabled(stepper)["postprocess"]
    text = pane(stepper, "preprocess")
    assert text.startswith(str(result))  # the StageResult the harness keeps, as it renders itself
    assert "preprocess ok" in text

    stepper.buttons["inference"].click()
    stepper.buttons["postprocess"].click()
    [top] = h.results["postprocess"].output
    assert max(top, key=top.get) == "circle"
    assert all(enabled(stepper).values())
    assert "postprocess ok" in pane(stepper, "postprocess")
    assert [b.button_style for b in stepper.buttons.values()] == ["success"] * 4
    for stage in ("initialize", *LATER):  # one timing bar each
        assert f">{stage}</td>" in stepper.timing.value


def test_every_button_is_disabled_while_a_stage_runs():
    seen: dict[str, bool] = {}

    class Watched(ImageClassifier):
        def preprocess(self, data):
            seen.update({name: b.disabled for name, b in stepper.buttons.items()})
            seen.update(run_all=stepper.run_all_button.disabled, reset=stepper.reset_button.disabled)
            return super().preprocess(data)

    stepper = Stepper(harness(Watched), hk.batch(image("circle.png")), pictures=False)
    stepper.run_all_button.click()
    assert seen and all(seen.values()), seen
    assert "running" not in stepper.status.value
    assert not stepper.run_all_button.disabled and enabled(stepper)["postprocess"]


def test_the_stepper_shows_what_the_harness_already_holds():
    h = harness()
    h.initialize()
    stepper = Stepper(h, hk.batch(image("star.png")), pictures=False)
    assert enabled(stepper)["preprocess"]
    assert "initialize ok" in pane(stepper, "initialize")
    h.preprocess(stepper.batch)  # a cell ran a stage: refresh() redraws from h.results
    stepper.refresh()
    assert "preprocess ok" in pane(stepper, "preprocess")
    assert enabled(stepper)["inference"]


def test_a_stage_error_shows_its_fix_and_the_stepper_stays_usable():
    h = harness(Strict)
    stepper = Stepper(h, hk.batch(image("circle.png"), hk.Request.from_file(BAD / "truncated.png")), pictures=False)
    stepper.run_all_button.click()  # stops at the failing stage
    error = h.results["preprocess"].error
    assert error is not None and error.request_index == 1
    assert "inference" not in h.results
    text = pane(stepper, "preprocess")
    assert text.startswith(f"preprocess failed in {h.name} for request 1: ") and text.count("preprocess failed") == 1
    assert f"fix: {error.fix}" in text
    markup = stepper.outputs["preprocess"].outputs[0]["data"]["text/html"]
    assert markup.count("preprocess failed") == 1 and f"<b>preprocess failed in {h.name} for request 1: " in markup
    assert enabled(stepper) == {"initialize": True, "preprocess": True, "inference": False, "postprocess": False}
    assert stepper.buttons["preprocess"].button_style == "danger"
    assert ">failed</td>" in stepper.timing.value

    stepper.batch = hk.batch(image("circle.png"), image("star.png"))  # the fix: a good batch
    assert pane(stepper, "preprocess") == ""
    stepper.buttons["preprocess"].click()
    assert h.results["preprocess"].ok and "preprocess ok" in pane(stepper, "preprocess")
    stepper.run_all_button.click()
    assert [max(p, key=p.get) for p in h.results["postprocess"].output] == ["circle", "star"]


class Breakable(ImageClassifier):
    """An image classifier with a bug in preprocess until ``broken`` is set to False."""

    broken = True

    def preprocess(self, data):
        if self.broken:
            raise ValueError("crop size must be positive")
        return super().preprocess(data)


def test_a_bug_in_the_handler_fixed_then_clicked_again():
    h = harness(Breakable)
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    stepper.buttons["initialize"].click()
    stepper.buttons["preprocess"].click()
    text = pane(stepper, "preprocess")
    assert "ValueError: crop size must be positive" in text
    assert "fix: ValueError was raised at test_stepper.py line" in text  # the handler's own line
    assert not enabled(stepper)["inference"]

    h.handler.broken = False
    stepper.buttons["preprocess"].click()
    assert h.results["preprocess"].ok
    assert "crop size" not in pane(stepper, "preprocess")
    assert enabled(stepper)["inference"]


def test_an_initialize_failure_disables_every_later_stage(tmp_path):
    h = hk.Harness("image_classifier", hk.MockContext(model_dir=tmp_path / "missing"))
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    stepper.buttons["initialize"].click()
    assert not h.results["initialize"].ok
    assert "fix: point the context at the model dir" in pane(stepper, "initialize")
    assert enabled(stepper) == {"initialize": True, "preprocess": False, "inference": False, "postprocess": False}


def test_upload_adds_a_request_and_drops_later_stages():
    h = harness()
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    stepper.run_all_button.click()
    assert len(h.results["postprocess"].output) == 1

    star = (IMAGES / "star.png").read_bytes()
    # A browser may send no content type: the file name's extension gives it.
    stepper.upload.value = (upload_file("star.png", star, ""),)
    assert stepper.upload.value == ()  # emptied, ready for the next file
    assert stepper.batch_size.value == "batch: 2 requests"
    assert stepper.batch[1].parameters[0].content_type == "image/png"
    assert list(h.results) == ["initialize"]
    assert all(pane(stepper, s) == "" for s in LATER)
    assert enabled(stepper) == {"initialize": True, "preprocess": True, "inference": False, "postprocess": False}
    assert "added 1 request(s): star.png" in stepper.status.value

    stepper.run_all_button.click()
    assert [max(p, key=p.get) for p in h.results["postprocess"].output] == ["circle", "star"]


def test_upload_into_an_empty_stepper_enables_preprocess():
    h = harness()
    stepper = Stepper(h, pictures=False)
    stepper.buttons["initialize"].click()
    assert stepper.batch is None and not enabled(stepper)["preprocess"]
    assert stepper.run_all_button.disabled
    stepper.upload.value = (upload_file("circle.png", (IMAGES / "circle.png").read_bytes(), "image/png"),)
    assert enabled(stepper)["preprocess"] and stepper.batch_size.value == "batch: 1 request"


def test_reset_goes_back_to_the_given_batch_and_keeps_the_loaded_model():
    h = harness()
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    stepper.add_request(image("star.png"))
    stepper.run_all_button.click()
    assert len(h.results["postprocess"].output) == 2

    stepper.reset_button.click()
    assert len(stepper.batch) == 1 and stepper.batch_size.value == "batch: 1 request"
    assert list(h.results) == ["initialize"]
    assert all(pane(stepper, s) == "" for s in LATER)
    assert enabled(stepper)["preprocess"] and not enabled(stepper)["inference"]
    stepper.run_all_button.click()
    assert len(h.results["postprocess"].output) == 1


class Chatty(ImageClassifier):
    """Logs and warns in preprocess; postprocess breaks the one-item-per-request rule."""

    def preprocess(self, data):
        logging.getLogger("chatty").info("decoding %d image(s)", len(data))
        warnings.warn("images are resized to 256", UserWarning)
        return super().preprocess(data)

    def postprocess(self, data):
        return super().postprocess(data) * 2


def test_logs_and_warnings_are_shown_in_their_stage():
    h = harness(Chatty)
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    stepper.run_all_button.click()
    pre = pane(stepper, "preprocess")
    assert "log: INFO chatty: decoding 1 image(s)" in pre
    assert "warning: UserWarning: images are resized to 256" in pre
    assert "chatty" not in pane(stepper, "inference")
    # The harness's own warning about the output (raised after the stage) lands in that pane.
    post = pane(stepper, "postprocess")
    assert "warning: HandlerkitWarning: handlerkit: postprocess: must return one item per request: got 2 item(s) for a batch of 1" in post


def test_a_function_handler_gets_a_handle_button():
    def handle(data, context):
        return None if data is None else [len(data)] * len(data)

    h = hk.Harness(handle, hk.MockContext())
    stepper = Stepper(h, hk.batch(hk.Request.json({"x": 1})), pictures=False)
    assert stepper.stages == ("initialize", "handle")
    stepper.buttons["initialize"].click()
    stepper.buttons["handle"].click()
    assert h.results["handle"].output == [1]
    assert "handle ok" in pane(stepper, "handle")


class Report(Rendered):
    __slots__ = ()

    def _summary(self) -> str:
        return "compile report: 1 graph, 0 breaks"

    def _tables(self) -> list[Table]:
        return [Table(("", ""), [("graphs", 1)])]


def test_the_compile_button_runs_the_harness_report():
    h = harness()
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    stepper.run_all_button.click()
    results = dict(h.results)
    report = stepper.compile_report()  # what the compile button does
    assert type(report).__name__ == "CompileReport"
    assert output_text(stepper.compile_output.outputs) == str(report)
    # The report's own runs leave the stepped results alone.
    assert list(h.results) == list(results) and all(h.results[k] is v for k, v in results.items())


def test_the_compile_panel_shows_a_report_or_its_error():
    h = harness()
    seen = []
    h.compile_report = lambda batch: seen.append(batch) or Report()  # the report is diagnostics' job
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    stepper.compile_button.click()
    assert seen == [stepper.batch]
    [out] = stepper.compile_output.outputs
    assert out["data"]["text/plain"].startswith("compile report: 1 graph, 0 breaks")
    assert "<table" in out["data"]["text/html"]

    def failing(batch):
        raise hk.HandlerkitError("torch.compile is not available", fix="pip install torch>=2.4")

    h.compile_report = failing
    stepper.compile_button.click()
    assert "fix: pip install torch>=2.4" in output_text(stepper.compile_output.outputs)


def test_pictures_and_tensor_summaries_come_from_viz():
    pytest.importorskip("matplotlib")
    viz = pytest.importorskip("handlerkit.viz")
    h = harness()
    stepper = Stepper(h, hk.batch(image("circle.png")))
    stepper.run_all_button.click()
    for stage in ("preprocess", "inference"):
        [picture] = stepper.picture_outputs[stage].outputs  # beside the result, in the stage's tab
        assert "image/png" in picture["data"], stage
        assert viz.summary(h.results[stage].output) in " ".join(pane(stepper, stage).split())  # wrapped at 100 columns
    # The postprocess tab shows the answer, not a picture redrawing inference's bars.
    assert not any("image/png" in o.get("data", {}) for o in stepper.picture_outputs["postprocess"].outputs)


def test_displays_as_its_root_widget():
    stepper = Stepper(harness(), hk.batch(image("circle.png")), pictures=False)
    bundle = stepper._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == stepper.widget.model_id


def test_needs_ipywidgets_and_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    with pytest.raises(ImportError, match=r"hk.Stepper needs ipywidgets: pip install 'handlerkit\[notebook\]'"):
        Stepper(harness(), hk.batch(image("circle.png")))


def test_importing_the_widgets_module_imports_no_widget_library():
    code = "import sys, handlerkit, handlerkit.widgets; print(sorted({'ipywidgets', 'matplotlib'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(ROOT))
    assert out.stdout.strip() == "[]"


def test_text_names_the_panes_it_has():
    stepper = Stepper(harness(), hk.batch(image("circle.png")), pictures=False)
    with pytest.raises(ValueError, match="no 'explain' pane; the stages are initialize, preprocess"):
        stepper.text("explain")


def test_a_click_shows_its_stage_tab_and_the_tabs_hold_the_rest():
    h = harness(Strict)
    stepper = Stepper(h, hk.batch(image("circle.png")), pictures=False)
    assert stepper.tab_names == (
        "initialize",
        "preprocess",
        "inference",
        "postprocess",
        "stream",
        "wall time",
        "device",
        "compile",
    )
    shown = lambda: stepper.tab_names[stepper.tabs.selected_index]
    stepper.buttons["initialize"].click()
    assert shown() == "initialize"
    stepper.buttons["preprocess"].click()
    assert shown() == "preprocess"
    stepper.run_all_button.click()
    assert shown() == "postprocess"
    stepper.select("device")
    assert shown() == "device"
    stepper.batch = hk.batch(image("circle.png"), hk.Request.from_file(BAD / "truncated.png"))
    stepper.run_all_button.click()  # stops at the failing stage, whose tab stays shown
    assert shown() == "preprocess" and "fix: " in pane(stepper, "preprocess")
    with pytest.raises(ValueError, match=r"no 'timing' tab; the tabs are initialize, preprocess, .*, compile"):
        stepper.select("timing")


def test_the_postprocess_tab_shows_each_requests_answer_not_a_picture_again(tmp_path):
    """A ranked list per request (a multi-input ranker): the answer in full, scores visible."""
    from _new_users import ranker_dir, ranker_request

    h = hk.Harness.open(ranker_dir(tmp_path / "recs"))
    batch = hk.batch(hk.Request.json(ranker_request(1, [3, 5])), hk.Request.json(ranker_request(2, [7, 1, 4])))
    stepper = Stepper(h, batch)
    stepper.run_all_button.click()
    answers = h.results["postprocess"].output
    [answer] = stepper.picture_outputs["postprocess"].outputs  # text only: inference's picture is not redrawn
    lines = output_text([answer]).splitlines()
    assert lines[0] == "answer: what each of 2 request(s) gets"
    assert lines[1:] == [f"request {i}: {json.dumps(a)}" for i, a in enumerate(answers)]
    assert [len(a) for a in answers] == [2, 3] and '"score": ' in lines[2]
    assert f"{json.dumps(answers[1])}</pre>" in answer["data"]["text/html"].replace("&quot;", '"')


def test_a_bytes_answer_is_described_and_drawn(tmp_path):
    """A PNG-bytes-out filter: the answer is what the client gets, a PNG, so it is drawn."""
    pytest.importorskip("matplotlib")
    from _new_users import image_filter_dir, png_bytes

    model = image_filter_dir(tmp_path / "blur")
    h = hk.Harness.open(model)
    stepper = Stepper(h, hk.batch(hk.Request.from_bytes(png_bytes(24, 16), "image/png")))
    stepper.run_all_button.click()
    answer, picture = stepper.picture_outputs["postprocess"].outputs
    assert re.fullmatch(
        r"answer: what each of 1 request\(s\) gets\nrequest 0: PNG image, 24x16, \d+ B", output_text([answer])
    )
    assert "image/png" in picture["data"]
