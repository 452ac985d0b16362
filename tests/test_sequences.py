"""hk.Sequences: TorchServe's sequence batching and continuous batching around a Harness."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _stateful_handlers import CONTINUOUS_CONFIG, SEQUENCE_CONFIG, SEQUENCE_SUM, STREAMING_SUM, model_dir

import handlerkit as hk
from handlerkit.sequences import Sequences

START, SEQ_ID, END = "ts_request_sequence_start", "ts_request_sequence_id", "ts_request_sequence_end"


def text(value: int) -> hk.Request:
    return hk.Request.text(str(value))


@pytest.fixture
def summing(tmp_path: Path) -> hk.Harness:
    return hk.Harness.open(model_dir(tmp_path, "sums", SEQUENCE_SUM, SEQUENCE_CONFIG.replace("batchSize: 4", "batchSize: 2")))


@pytest.fixture
def streaming(tmp_path: Path) -> hk.Harness:
    return hk.Harness.open(model_dir(tmp_path, "streams", STREAMING_SUM, CONTINUOUS_CONFIG))


def test_headers_are_the_frontends_and_the_handler_reads_them_unchanged(summing):
    seqs = Sequences(summing)
    a = seqs.start(text(1))
    assert re.fullmatch(r"ts-seq-[0-9a-f-]{36}", a.id)
    a.send(text(2))
    first, second = a.jobs
    assert dict(first.request.headers) == {START: "true", SEQ_ID: a.id, "Content-Type": "text/plain"}
    assert dict(second.request.headers) == {SEQ_ID: a.id, "Content-Type": "text/plain"}
    own = seqs.start(text(5), sequence_id="mine")  # a client's own id: no start header
    assert own.id == "mine" and START not in own.jobs[0].request.headers
    seqs.run()
    assert a.answers == [1, 3] and own.answers == [5]
    assert summing.context.get_sequence_id(0) == a.id  # the last batch, read as a handler reads it


def test_sequence_batching_takes_one_request_per_sequence_up_to_batch_size(summing):
    seqs = Sequences(summing)  # batchSize 2, not continuous
    a, b, c = (seqs.start(text(n)) for n in (1, 10, 100))
    a.send(text(2))
    b.send(text(20))
    steps = seqs.run()
    ids = [[seqs_of(seqs, rid) for rid in step.request_ids] for step in steps]
    assert ids == [[a.id, b.id], [a.id, b.id], [c.id]]
    assert [step.left == step.request_ids for step in steps] == [True, True, True]  # nobody stays
    assert (a.answers, b.answers, c.answers) == ([1, 3], [10, 30], [100])
    assert all(job.state == "done" for job in seqs.jobs) and not seqs.pending


def seqs_of(seqs: Sequences, request_id: str) -> str:
    return next(job.sequence_id for job in seqs.jobs if job.request_id == request_id)


def test_an_unfinished_request_stays_and_others_join_the_running_batch(streaming):
    seqs = Sequences(streaming)
    a = seqs.start(text(2))
    seqs.step()
    odd = a.send(text(3))  # odd: streams, five more steps
    first = seqs.step()
    assert first.joined == [odd.request_id] and first.left == [] and seqs.running == [odd]
    assert first.headers[0]["ts_stream_next"] == "true" and first.headers[0][SEQ_ID] == a.id
    b = seqs.start(text(10))  # joins mid-way
    joined = seqs.step()
    assert joined.request_ids == [odd.request_id, b.jobs[0].request_id]
    assert joined.continued == [odd.request_id] and joined.joined == [b.jobs[0].request_id]
    # Called again as the frontend sends a request cached in the backend: same id, same
    # headers, no parameters (its row is {}); the new one comes whole.
    rows = joined.run.stages["preprocess"].input
    assert rows == [{}, {"body": "10"}]
    assert streaming.context.get_all_request_header(0)[SEQ_ID] == a.id
    rest = seqs.run()
    assert [len(s.request_ids) for s in rest] == [1, 1, 1, 1]
    assert rest[-1].left == [odd.request_id] and rest[-1].headers[0]["ts_stream_next"] == "false"
    assert odd.answers == [5] * 6 and odd.steps == [1, 2, 3, 4, 5, 6] and odd.state == "done"


def test_the_handlers_state_is_visible_between_steps(streaming):
    seqs = Sequences(streaming)
    a = seqs.start(text(2))
    seqs.step()
    odd = a.send(text(3))
    steps = [seqs.step() for _ in range(6)]
    assert [s.cache[odd.request_id]["left"] for s in steps[:5]] == [4, 3, 2, 1, 0]
    assert odd.request_id not in steps[5].cache  # forgotten when finished
    assert steps[0].cache[a.id] == {"cancel": False, "end": False, "requests": 1}
    assert seqs.cache is streaming.context.cache and seqs.cache[a.id]["requests"] == 0


def test_end_closes_the_sequence_drops_what_is_queued_and_the_id_opens_a_new_one(streaming):
    seqs = Sequences(streaming)
    a = seqs.start(text(4))
    seqs.step()
    ender = a.send(text(0))
    late = a.send(text(8))
    step = seqs.step()
    assert step.ended == [a.id] and step.headers[0][END] == a.id and a.finished
    assert (ender.state, late.state) == ("done", "dropped") and not seqs.pending
    again = seqs.send(text(7), sequence_id=a.id)  # no open sequence: a new one, no start header
    assert again.sequence_id == a.id and seqs.sequences[a.id] is not a
    reopened = seqs.step()  # the handler's LRU still holds the old sum, as the example's does
    assert reopened.answers == [11] and reopened.ended == [] and seqs.running == [again]
    other = seqs.send(text(6), sequence_id="never-opened")
    closed = seqs.step()  # a sequence the handler never saw opened: it closes it at once
    assert closed.answers == [11, 6] and closed.ended == ["never-opened"] and other.state == "done"


def test_cancel_ends_the_sequences_running_stream(streaming):
    seqs = Sequences(streaming)
    a = seqs.start(text(2))
    seqs.step()
    odd = a.send(text(5))
    seqs.step()
    cancel = a.send(text(-1))
    step = seqs.step()
    assert step.answers == [7, -1] and set(step.left) == {odd.request_id, cancel.request_id}
    assert step.headers[0]["ts_stream_next"] == "false" and "ts_stream_next" not in step.headers[1]
    assert not seqs.pending and a.id in seqs.sequences  # cancelled, not ended


def stream_marker(data, context):
    """Marks its answers unfinished with the header alone, without stopping criteria."""
    if data is None:
        return None
    for idx in range(len(data)):
        context.set_response_header(idx, "ts_stream_next", "true")
    return ["x"] * len(data)


def test_a_header_left_true_without_stopping_criteria_ends_the_request_as_the_worker_does():
    seqs = Sequences(hk.Harness(stream_marker), continuous=True)
    seqs.start(text(1))
    step = seqs.step()
    assert step.headers[0]["ts_stream_next"] == "false" and not seqs.pending


def never_done(data, context):
    if data is None:
        return None
    context.stopping_criteria = [lambda answer: False] * len(data)
    return [1] * len(data)


def test_run_stops_after_max_steps_when_a_stream_never_ends():
    seqs = Sequences(hk.Harness(never_done), continuous=True)
    seqs.start(text(1))
    with pytest.raises(hk.HandlerkitError, match=r"3 steps ran and 1 requests are still unfinished") as info:
        seqs.run(max_steps=3)
    assert "stopping criteria" in info.value.fix


def test_the_queue_and_sequence_limits_are_refused_as_torchserve_answers_503(summing):
    seqs = Sequences(summing, max_sequence_job_queue_size=2, max_num_sequence=1)
    a = seqs.start(text(1))
    a.send(text(2))
    with pytest.raises(hk.HandlerkitError, match=r"2 requests queued, the most maxSequenceJobQueueSize allows \(2\)"):
        a.send(text(3))
    with pytest.raises(hk.HandlerkitError, match=r"1 sequences are open, the most maxNumSequence allows \(1\)"):
        seqs.start(text(4))
    assert Sequences(summing).max_queue == 10  # from model-config.yaml


def broken(data, context):
    if data is None:
        return None
    if any(row.get("body") == "boom" for row in data):
        raise ValueError("boom")
    return ["ok"]  # one answer, whatever the batch


def test_a_failed_batch_ends_every_request_in_it_and_the_error_is_raised():
    seqs = Sequences(hk.Harness(broken), batch_size=2)
    seqs.start(hk.Request.text("boom"))
    seqs.start(text(1))
    with pytest.raises(hk.StageError, match="boom"):
        seqs.step()
    assert [job.state for job in seqs.jobs] == ["failed", "failed"] and not seqs.pending
    assert isinstance(seqs.steps[0].error, hk.StageError) and "failed" in repr(seqs.steps[0])
    seqs.start(text(1))
    seqs.start(text(2))
    with (
        pytest.raises(hk.HandlerkitError, match=r"handle answered list for a batch of 2: TorchServe's worker fails"),
        pytest.warns(hk.HandlerkitWarning, match="must return one item per request"),
    ):
        seqs.step()


def test_requests_must_come_through_the_frontend():
    seqs = Sequences(hk.Harness(broken))
    with pytest.raises(TypeError, match="a sequence request comes through the frontend, with headers"):
        seqs.start(hk.Request.from_item([1.0]))


def test_a_step_shows_who_was_in_it(streaming):
    seqs = Sequences(streaming)
    assert seqs.step() is None  # no work
    seqs.start(text(2))
    step = seqs.step()
    assert repr(step) == "<Step step 0: 1 requests (1 joined, 0 continued, 1 left)>"
    table = str(step)
    assert "joined" in table and "left" in table and step.request_ids[0][:8] in table
    assert "text/html" in step._repr_mimebundle_()
    assert "continuous batching, batchSize 4" in repr(seqs) and "1 steps" in repr(seqs)


def test_a_handlers_warning_is_shown_once_across_the_steps():
    class Whole:  # overrides handle without the stages: the Harness warns about it at every run
        def initialize(self, context):
            pass

        def preprocess(self, data):
            return data

        def handle(self, data, context):
            return [len(data)] * len(data)

    seqs = hk.Sequences(hk.Harness(Whole), batch_size=1, max_sequence_job_queue_size=3)
    first = seqs.start(hk.Request.text("a"))
    first.send(hk.Request.text("b"))
    first.send(hk.Request.text("c"))
    with pytest.warns(hk.HandlerkitWarning) as said:
        steps = seqs.run()
    assert len(steps) == 3 and all(step.run.problems for step in steps)  # each step keeps its problems
    assert len([w for w in said if "never called preprocess" in str(w.message)]) == 1


def test_a_cancel_request_marks_the_streams_it_ends_cancelled_in_its_step(streaming):
    seqs = Sequences(streaming)
    a = seqs.start(text(2))
    b = seqs.start(text(4))
    seqs.step()
    odd, other = a.send(text(5)), b.send(text(7))
    streamed = seqs.step()
    assert [streamed.state_of(j.request_id) for j in (odd, other)] == ["joined", "joined"]
    cancel = a.cancel(text(-1))
    step = seqs.step()
    assert cancel.cancels and step.cancelled == [odd.request_id]  # b's stream runs on
    assert [step.state_of(j.request_id) for j in (odd, other, cancel)] == ["cancelled", "running", "finished"]
    assert (odd.state, cancel.state, other.state) == ("cancelled", "done", "running")
    assert "cancelled" in str(step) and "runs on" in str(step)
    with pytest.raises(KeyError, match=r"was not in step 2 \(its requests"):
        step.state_of(a.jobs[0].request_id)


def test_a_failed_step_marks_every_request_failed():
    def broken(data, context):
        if data is None:
            return None
        raise ValueError("no")

    seqs = Sequences(hk.Harness(broken), continuous=True)
    job = seqs.start(text(1)).jobs[0]
    with pytest.raises(hk.HandlerkitError):
        seqs.step()
    assert seqs.steps[0].state_of(job.request_id) == "failed" and job.state == "failed"
