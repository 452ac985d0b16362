"""handlerkit.worker.sequence_batches: the frontend's rule for a stateful model's next batch."""

from __future__ import annotations

from collections import deque

import handlerkit as hk
from handlerkit.worker.sequence_batches import capacity, next_batch, resent


def test_continuous_batching_doubles_the_batch_size():
    assert (capacity(4, False), capacity(4, True), capacity(1, True)) == (4, 8, 2)


def test_running_requests_come_first_then_one_new_request_per_sequence():
    queues = [deque(["a1", "a2"]), deque(), deque(["c1"])]
    continued, joining = next_batch(["r1"], queues, 4)
    assert (continued, joining) == (["r1"], ["a1", "c1"])  # a2 waits: one request per sequence
    assert [list(q) for q in queues] == [["a2"], [], []]


def test_no_request_joins_a_full_batch_and_later_sequences_wait():
    queues = [deque(["a1"]), deque(["b1"]), deque(["c1"])]
    assert next_batch(["r1", "r2"], queues, 3) == (["r1", "r2"], ["a1"])
    assert next_batch(["r1", "r2", "r3"], queues, 3) == (["r1", "r2", "r3"], [])
    assert [list(q) for q in queues] == [[], ["b1"], ["c1"]]


def test_a_running_request_is_resent_without_its_parameters():
    request = hk.Request.text("3").with_headers({"ts_request_sequence_id": "s"})
    again = resent(request)
    assert (again.request_id, again.headers, again.parameters) == (request.request_id, request.headers, ())
    assert hk.Batch([again]).data == [{}]
