"""handlerkit/widgets/live.py and the Stepper's stream button: a live pane per request, updated
from h.stream's chunk generator as each chunk is sent (seen here by watching the pane's value
change while handle still runs), then each request's final answer; a failure mid-stream keeps
the chunks and says so, and the Stepper stays usable."""

from __future__ import annotations

import time

import pytest

import handlerkit as hk
from handlerkit.widgets import Stepper

pytest.importorskip("ipywidgets")

from ts.handler_utils.utils import send_intermediate_predict_response  # noqa: E402


def _stepper(fail=False):
    seen_while_running: list[str] = []  # pane 0's text, read by handle itself after its first chunk
    box = {}

    def handle(data, context):
        if data is None:
            return None
        for word in ("Hel", "lo ", "world"):
            send_intermediate_predict_response([word] * len(data), context.request_ids, "Result", 200, context)
            if word == "Hel":  # the pane is fed from the generator in the caller's thread: wait for it
                deadline = time.monotonic() + 5
                while "Hel" not in box["stepper"].live.texts[0] and time.monotonic() < deadline:
                    time.sleep(0.002)
                seen_while_running.append(box["stepper"].live.texts[0])
        if fail:
            raise ValueError("the generator ran out of memory")
        return [f"done {i}" for i in range(len(data))]

    h = hk.Harness(handle, hk.MockContext(gpu_id=None))
    batch = hk.batch(hk.Request.json({"n": 0}, request_id="a"), hk.Request.json({"n": 1}, request_id="b"))
    box["stepper"] = Stepper(h, batch, pictures=False)
    return box["stepper"], h, seen_while_running


def test_each_chunk_reaches_its_request_s_pane_while_handle_still_runs():
    stepper, h, seen_while_running = _stepper()
    values: list[str] = []
    start = stepper.live.start

    def start_and_watch(count):
        start(count)
        stepper.live.panes[0].observe(lambda change: values.append(change["new"]), names="value")

    stepper.live.start = start_and_watch
    assert "click stream to run h.stream(batch)" in stepper.live.widget.children[0].value  # before the first
    run = stepper.stream()
    assert stepper.tab_names[stepper.tabs.selected_index] == "stream"  # the live panes are shown as they fill
    assert run is h.last_run and run.output == ["done 0", "done 1"]
    assert seen_while_running == ["request 0: Hel\nstreaming… 1 chunk(s), the last at " + f"{run.chunks[0].time_ms:.1f} ms"]
    bodies = [v.split("<pre", 1)[1].split("</pre>")[0].split(">", 1)[1] for v in values]
    assert bodies == ["Hel", "Hello ", "Hello world", "Hello world"]  # a value per chunk, then the final one
    assert stepper.live.texts == [
        "request 0: Hello world\nfinal answer at " + f"{run.handle_ms:.1f} ms: done 0",
        "request 1: Hello world\nfinal answer at " + f"{run.handle_ms:.1f} ms: done 1",
    ]
    assert "first chunk at" in stepper.live.panes[1].value
    assert stepper.outputs["handle"].outputs  # the run's stage drawn in its pane after
    assert not stepper.stream_button.disabled and stepper.buttons["handle"].button_style == "success"


def test_a_failure_mid_stream_keeps_the_chunks_and_says_why():
    stepper, h, _ = _stepper(fail=True)
    assert stepper.stream() is None
    failed = "failed: handle failed in _stepper.<locals>.handle for the batch: ValueError: the generator ran out"
    assert stepper.live.texts[0].startswith("request 0: Hello world\n" + failed)
    assert stepper.live.texts[1].startswith("request 1: Hello world\n" + failed)
    assert "the generator ran out of memory" in stepper.text("handle")  # the stage's pane has the error too
    assert h.results["handle"].error is not None and not stepper.stream_button.disabled


def test_without_a_batch_the_stream_button_is_disabled_and_a_call_says_what_to_do():
    h = hk.Harness(lambda data, context: None if data is None else ["x"] * len(data), hk.MockContext(gpu_id=None))
    stepper = Stepper(h, pictures=False)
    assert stepper.stream_button.disabled
    assert stepper.stream() is None
    assert "streaming needs a batch: add a request with the upload button" in stepper.status.value


def test_a_chunk_for_a_request_not_in_the_batch_is_left_out_of_the_panes():
    from handlerkit.worker.streaming import Chunk

    stepper, _, _ = _stepper()
    stepper.live.start(1)
    stepper.live.add(Chunk("stranger", None, b"?", 200, "", "", {}, 1.0, 0))
    stepper.live.add(Chunk("a", 0, b"ok", 200, "", "", {}, 2.0, 1))
    assert stepper.live.texts == ["request 0: ok\nstreaming… 1 chunk(s), the last at 2.0 ms"]
