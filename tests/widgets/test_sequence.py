"""hk.Stepper(seqs): the buttons drive the same hk.Sequences (``seqs.steps`` holds what they
produced); the panes show a row per step (who joined, ran on, finished or was cancelled), each
request's answers and chunks, the handler's state after a chosen step, and hk.show(seqs).

Buttons are clicked with ``Button.click()``, which runs the same callbacks a browser click does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _stateful_handlers import CONTINUOUS_CONFIG, STREAMING_SUM, model_dir
from ts.handler_utils.utils import send_intermediate_predict_response

import handlerkit as hk
from handlerkit.sequences import Sequences
from handlerkit.widgets import SequenceStepper, Stepper

pytest.importorskip("ipywidgets")

END, CANCEL = hk.Request.text("0"), hk.Request.text("-1")


@pytest.fixture
def seqs(tmp_path: Path) -> Sequences:
    return Sequences(hk.Harness.open(model_dir(tmp_path, "streams", STREAMING_SUM, CONTINUOUS_CONFIG)))


def enabled(stepper: SequenceStepper) -> dict[str, bool]:
    buttons = ("send", "step", "run", "end", "cancel")
    return {name: not getattr(stepper, f"{name}_button").disabled for name in buttons}


def step_text(stepper: SequenceStepper, index: int) -> str:
    """Step ``index``'s rows in the steps pane (which shows the newest step first), after its
    ``step N: `` title."""
    steps = stepper.text("steps").split("\nstep ")
    [text] = [s for s in steps if s.removeprefix("step ").startswith(f"{index}: ")]
    return text.removeprefix("step ").removeprefix(f"{index}: ")


def type_and_send(stepper: SequenceStepper, body: str) -> None:
    stepper.body.value = body
    stepper.send_button.click()


def test_stepper_of_sequences_is_their_stepper_and_its_buttons_follow_what_can_run(seqs):
    stepper = hk.Stepper(seqs, end=END, cancel=CANCEL, pictures=False)
    assert isinstance(stepper, SequenceStepper) and stepper.sequences is seqs
    assert isinstance(Stepper(seqs.harness), Stepper)  # on a Harness, the stage Stepper
    assert enabled(stepper) == {"send": True, "step": False, "run": False, "end": False, "cancel": False}
    assert stepper.text("steps") == "no step has run yet\n"
    assert "the handler's state shows after the first step" in stepper.text("state")

    type_and_send(stepper, "2")  # into a new sequence
    (job,) = seqs.jobs
    assert stepper.target.value == job.sequence_id and job.state == "queued"
    assert f"queued request {job.request_id[:8]} in {job.sequence_id}" in stepper.text("message")
    assert enabled(stepper) == {"send": True, "step": True, "run": True, "end": True, "cancel": True}

    stepper.step_button.click()
    assert len(seqs.steps) == 1 and job.state == "done"
    assert stepper.text("steps").startswith("step 0: 1 requests (1 joined, 0 continued, 1 left)")
    assert "done" in stepper.text("requests") and not enabled(stepper)["step"]
    state = stepper.text("state")  # the handler's context.cache after step 0
    assert state.startswith("context.cache after step 0")
    assert job.sequence_id in state and "{'cancel': False, 'end': False, 'requests': 0}" in " ".join(state.split())
    assert stepper.end_button.tooltip == "send {'body': '0'} as the end of the chosen sequence, then run a step"

    type_and_send(stepper, "4")  # chosen for you: the sequence sent to last
    stepper.target.value = "new sequence"  # your own choice stays over the next steps
    stepper.step_button.click()
    assert stepper.target.value == "new sequence" and job.sequence_id in stepper.target.options


def test_a_stream_runs_on_then_cancel_marks_it_and_end_closes_the_sequence(seqs):
    stepper = hk.Stepper(seqs, end=END, cancel=CANCEL, pictures=False)
    type_and_send(stepper, "2")
    stepper.step_button.click()
    type_and_send(stepper, "5")  # odd: streams, stays in the running batch
    stepper.step_button.click()
    type_and_send(stepper, "4")
    stepper.target.value = "new sequence"
    type_and_send(stepper, "9")  # another sequence (its start request finishes at once)
    other = seqs.jobs[-1].sequence_id
    stepper.step_button.click()
    first = seqs.jobs[0].sequence_id
    streamed = seqs.jobs[1]
    last = step_text(stepper, 2)
    assert last.startswith("3 requests (2 joined, 1 continued, 2 left)")
    assert [row.split()[-1] for row in last.splitlines()[-3:]] == ["on", "left", "left"]  # runs on, left, left

    stepper.target.value = first
    stepper.cancel_button.click()  # sends -1 as the cancel of the first sequence, runs a step
    step = seqs.steps[-1]
    assert step.cancelled == [streamed.request_id] and streamed.state == "cancelled"
    requests = stepper.text("requests")
    assert "cancelled" in requests and "done (its cancel)" in requests
    cancel_rows = step_text(stepper, 3).rstrip().splitlines()[-2:]
    assert [row.split()[-1] for row in cancel_rows] == ["cancelled", "left"]  # the stream, the cancel

    stepper.end_button.click()  # sends 0: the handler ends the first sequence
    assert seqs.steps[-1].ended == [first] and first not in seqs.sequences
    assert "ended sequence " + first in stepper.text("steps")
    assert stepper.target.value == "new sequence" and first not in stepper.target.options

    stepper.target.value = other
    type_and_send(stepper, "3")
    stepper.run_button.click()  # the other sequence's stream runs to its end
    assert not seqs.pending and seqs.jobs[-1].state == "done" and len(seqs.jobs[-1].steps) == 6
    assert not enabled(stepper)["step"] and not enabled(stepper)["run"]

    stepper.step_picker.value = 1  # the state between steps: the first stream's countdown then
    assert stepper.text("state").startswith("context.cache after step 1")
    state = " ".join(stepper.text("state").split())  # too wide for 100 columns: a block per key
    assert f"key {streamed.request_id} holds dict(4 keys) value {{'sequence': '{first}', 'start': False, 'stream': True, 'left': 4}}" in state
    stepper.step_picker.value = len(seqs.steps) - 1
    assert streamed.request_id not in stepper.text("state")  # forgotten once it left


def test_refusals_and_missing_requests_are_shown_with_their_fix_and_never_raised(tmp_path):
    config = CONTINUOUS_CONFIG.replace("maxSequenceJobQueueSize: 10", "maxSequenceJobQueueSize: 1")
    seqs = Sequences(hk.Harness.open(model_dir(tmp_path, "streams", STREAMING_SUM, config)))
    stepper = hk.Stepper(seqs, pictures=False)  # no end, no cancel
    assert stepper.step() is None and "nothing to run" in stepper.text("message")  # nothing queued
    type_and_send(stepper, "2")
    type_and_send(stepper, "4")  # a second queued request in one sequence: the frontend's 503
    message = stepper.text("message")
    assert "maxSequenceJobQueueSize allows (1): TorchServe answers this request 503" in message
    assert "fix: run a step first" in message and len(seqs.jobs) == 1
    assert not enabled(stepper)["end"] and "pass end=hk.Request" in stepper.end_button.tooltip
    assert stepper.end() is None
    assert "this Stepper has no end request" in stepper.text("message")
    assert "fix: pass the request your handler reads as end: hk.Stepper(seqs, end=" in stepper.text("message")
    stepper.run_to_end()
    stepper.end_request = END
    stepper.target.value = "new sequence"
    assert stepper.end() is None and "end needs an open sequence" in stepper.text("message")
    type_and_send(stepper, "x")  # not a number: the handler fails the batch
    stepper.step_button.click()
    assert "preprocess" in stepper.text("message") and "ValueError" in stepper.text("message")
    failed = step_text(stepper, len(seqs.steps) - 1)
    assert failed.startswith("1 requests (1 joined, 0 continued, 1 left), failed: ")
    assert failed.rstrip().splitlines()[-1].split()[-1] == "failed"  # the request's row
    assert seqs.jobs[-1].state == "failed"


def counting(data, context):
    """Each request streams a chunk per call and finishes after its third call."""
    if data is None:
        context.cache = {}
        return None
    calls = []
    for idx in range(len(data)):
        rid = context.get_request_id(idx)
        calls.append(context.cache.setdefault(rid, 0) + 1)
        context.cache[rid] = calls[-1]
    send_intermediate_predict_response([f"c{n}" for n in calls], context.request_ids, "Result", 200, context)
    context.stopping_criteria = [lambda answer, n=n: n >= 3 for n in calls]
    return [f"<{n}>" for n in calls]


def test_each_requests_answers_and_chunks_and_the_pictures():
    pytest.importorskip("matplotlib")
    seqs = Sequences(hk.Harness(counting), continuous=True)
    stepper = hk.Stepper(seqs)
    type_and_send(stepper, "a")
    stepper.step_button.click()
    stepper.target.value = "new sequence"
    type_and_send(stepper, "b")  # joins the running batch
    stepper.run_button.click()
    first, second = seqs.jobs
    assert first.steps == [0, 1, 2] and second.steps == [1, 2, 3]
    requests = stepper.text("requests")
    assert "<1><2><3>" in requests and "c1c2c3" in requests and "0-2" in requests and "1-3" in requests
    steps = stepper.text("steps")
    assert "step 1: 2 requests (1 joined, 1 continued, 0 left)" in steps
    assert "'<2>'" in steps and "c2" in steps  # a step's answer and its chunks, per request
    assert stepper.text("picture").startswith("<Figure size")  # hk.show(seqs)
    state = stepper.text("state")
    assert state.startswith("context.cache after step 3") and "<Figure size" not in state
    stepper.draw_state.value = True  # the state drawn as hk.show draws it
    assert stepper.text("state").startswith(state) and "<Figure size" in stepper.text("state")


def test_a_state_holding_tensors_shows_their_summaries_and_the_rest_as_it_is():
    torch = pytest.importorskip("torch")

    def generating(data, context):
        if data is None:
            context.cache = {}
            return None
        for idx in range(len(data)):
            entry = context.cache.setdefault(context.get_sequence_id(idx), {"state": torch.zeros(1, 1, 8), "text": ""})
            entry["text"] += "x"
        return ["x"] * len(data)

    seqs = Sequences(hk.Harness(generating), continuous=True)
    stepper = hk.Stepper(seqs, pictures=False)
    stepper.send("a")
    stepper.step()
    state = " ".join(stepper.text("state").split())
    sequence_id = seqs.jobs[0].sequence_id
    assert f"{sequence_id} dict(2 keys) 'state': Tensor[1, 1, 8] float32 cpu n=8 (32 B) min=0 max=0" in state
    assert state.endswith("all zeros; 'text': x")


def test_each_click_shows_its_tab_and_the_newest_step_comes_first(seqs):
    stepper = hk.Stepper(seqs, pictures=False)
    assert stepper.tab_names == ("steps", "requests", "picture")
    shown = lambda: stepper.tab_names[stepper.tabs.selected_index]
    type_and_send(stepper, "3")
    assert shown() == "requests" and "queued" in stepper.text("requests")
    stepper.step_button.click()
    type_and_send(stepper, "4")
    stepper.step_button.click()
    assert shown() == "steps"
    assert stepper.text("steps").startswith("step 1: ") and "\nstep 0: " in stepper.text("steps")
    assert stepper.text("state").startswith("context.cache after step 1")  # beside the steps, in their tab
    with pytest.raises(ValueError, match=r"no 'state' tab; the tabs are steps, requests, picture"):
        stepper.select("state")
