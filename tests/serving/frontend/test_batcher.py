"""The worker-driven batcher behind the Ray Serve adapter (plain asyncio, no Ray).

It must form batches as TorchServe's ``Model.pollBatch`` does: only when the worker is free,
taking at once what queued up meanwhile, waiting at most ``maxBatchDelay`` for the rest.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from handlerkit.serving.frontend.batcher import Batcher


class Worker:
    """A ``run`` that records each batch and takes ``seconds`` per batch."""

    def __init__(self, seconds: float = 0.0, fail_on: Any = None) -> None:
        self.seconds = seconds
        self.fail_on = fail_on
        self.batches: list[tuple[Any, list[Any]]] = []
        self.running = 0

    async def __call__(self, kind: Any, items: list[Any]) -> list[Any]:
        self.running += 1
        assert self.running == 1, "two batches ran at once"
        self.batches.append((kind, list(items)))
        try:
            await asyncio.sleep(self.seconds)
            if self.fail_on is not None and self.fail_on in items:
                raise ValueError(f"bad item {self.fail_on}")
            return [f"{kind}:{item}" for item in items]
        finally:
            self.running -= 1


def test_requests_queued_while_the_worker_is_busy_form_one_full_batch() -> None:
    async def main() -> Worker:
        worker = Worker(seconds=0.05)
        batcher = Batcher(worker, max_batch_size=8, max_delay_s=0.01)
        first = asyncio.ensure_future(batcher.submit("a"))
        await asyncio.sleep(0.02)  # "a" runs alone; the next 16 arrive while it runs
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(16)]
        answers = await asyncio.gather(first, *rest)
        assert answers == ["predict:a"] + [f"predict:{i}" for i in range(16)]
        return worker

    worker = asyncio.run(main())
    # Ray's @serve.batch would have closed a batch of whatever came within 10 ms of the first
    # arrival, while "a" still ran; TorchServe's way takes 8 and 8 once the worker is free.
    assert [len(items) for _, items in worker.batches] == [1, 8, 8]
    assert [items for _, items in worker.batches][1:] == [list(range(8)), list(range(8, 16))]


def test_a_partial_batch_waits_max_delay_then_runs() -> None:
    async def main() -> tuple[Worker, float]:
        worker = Worker()
        batcher = Batcher(worker, max_batch_size=8, max_delay_s=0.2)
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(batcher.submit(2))  # within the delay: same batch
        await asyncio.gather(first, second)
        return worker, loop.time() - start

    worker, elapsed = asyncio.run(main())
    assert [items for _, items in worker.batches] == [[1, 2]]
    assert elapsed >= 0.19  # waited out maxBatchDelay for 6 more that never came


def test_zero_delay_takes_only_what_is_queued() -> None:
    async def main() -> Worker:
        worker = Worker()
        batcher = Batcher(worker, max_batch_size=4, max_delay_s=0.0)
        await asyncio.gather(*(batcher.submit(i) for i in range(6)))
        return worker

    worker = asyncio.run(main())
    assert [len(items) for _, items in worker.batches] == [4, 2]


def test_kinds_never_share_a_batch_and_keep_their_order() -> None:
    async def main() -> tuple[Worker, list[Any]]:
        worker = Worker(seconds=0.02)
        batcher = Batcher(worker, max_batch_size=8, max_delay_s=0.0, solo=("describe",))
        blocker = asyncio.ensure_future(batcher.submit("x"))
        await asyncio.sleep(0.005)
        jobs = [("predict", 1), ("explain", 2), ("predict", 3), ("describe", 4), ("describe", 5), ("explain", 6)]
        answers = await asyncio.gather(blocker, *(batcher.submit(item, kind) for kind, item in jobs))
        return worker, answers

    worker, answers = asyncio.run(main())
    assert answers == ["predict:x", "predict:1", "explain:2", "predict:3", "describe:4", "describe:5", "explain:6"]
    assert worker.batches == [("predict", ["x"]), ("predict", [1, 3]), ("explain", [2, 6]),
                              ("describe", [4]), ("describe", [5])]


def test_a_failing_batch_fails_its_requests_only_and_the_batcher_goes_on() -> None:
    async def main() -> tuple[list[Any], Any]:
        worker = Worker(seconds=0.01, fail_on="bad")
        batcher = Batcher(worker, max_batch_size=2, max_delay_s=0.0)
        results = await asyncio.gather(*(batcher.submit(i) for i in ["ok", "bad", "fine"]), return_exceptions=True)
        return results, await batcher.submit("after")

    results, after = asyncio.run(main())
    assert [type(r).__name__ for r in results[:2]] == ["ValueError", "ValueError"]
    assert "bad item bad" in str(results[0])
    assert results[2] == "predict:fine"
    assert after == "predict:after"


def test_a_wrong_number_of_answers_fails_the_batch_with_a_clear_error() -> None:
    async def short(kind: Any, items: list[Any]) -> list[Any]:
        return items[:-1]

    async def main() -> list[Any]:
        batcher = Batcher(short, max_batch_size=2, max_delay_s=0.0)
        return await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) and "1 items for a batch of 2" in str(r) for r in results)


def test_a_request_cancelled_before_its_batch_is_dropped() -> None:
    async def main() -> Worker:
        worker = Worker(seconds=0.03)
        batcher = Batcher(worker, max_batch_size=8, max_delay_s=0.0)
        busy = asyncio.ensure_future(batcher.submit("busy"))
        await asyncio.sleep(0.005)
        gone = asyncio.ensure_future(batcher.submit("gone"))
        kept = asyncio.ensure_future(batcher.submit("kept"))
        await asyncio.sleep(0)
        gone.cancel()  # its client went away while it queued
        await asyncio.gather(busy, kept)
        assert batcher.pending == 0
        return worker

    worker = asyncio.run(main())
    assert [items for _, items in worker.batches] == [["busy"], ["kept"]]


def test_a_new_event_loop_gets_a_new_worker_task() -> None:
    worker = Worker()
    batcher = Batcher(worker, max_batch_size=2, max_delay_s=0.0)
    assert asyncio.run(batcher.submit(1)) == "predict:1"
    assert asyncio.run(batcher.submit(2)) == "predict:2"  # the first loop (and its task) is gone


@pytest.mark.parametrize(("size", "delay", "message"), [(0, 0.0, "max_batch_size"), (1, -1.0, "max_delay_s")])
def test_bad_settings_are_refused(size: int, delay: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Batcher(Worker(), max_batch_size=size, max_delay_s=delay)
