"""Batches formed when the worker is free, as TorchServe's frontend forms them (no Ray import).

TorchServe's worker thread asks its model's queue for a batch only once the previous one is
answered (``Model.pollBatch``): it blocks for the first job, then takes up to ``batchSize - 1``
more, waiting at most ``maxBatchDelay`` in all, taking at once whatever already queued up while
the worker was busy. Ray Serve's ``@serve.batch`` instead closes each batch as requests arrive,
whether or not the handler is free, so under load the handler runs many small batches formed
while it was busy (measured: mean 2.8–4 for a batch size of 8 on resnet18, where TorchServe runs
8; ``benchmarks/ray_vs_torchserve.py``). :class:`Batcher` is TorchServe's way on asyncio.

Requests of different kinds (predictions, explanations, describe) never share a batch: a
handler picks its mode from the first request's headers. A request whose caller went away
(its future cancelled) before its batch formed is dropped, as TorchServe drops a job whose
client timed out.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Collection, Hashable
from typing import Any, NamedTuple

__all__ = ["Batcher"]


class _Job(NamedTuple):
    kind: Hashable
    item: Any
    future: asyncio.Future


class Batcher:
    """One worker's queue: ``await submit(item)`` returns that item's answer from a batch.

    Args:
        run: ``await run(kind, items)`` answers one batch with a list as long as ``items``;
            it is never called twice at once. If it raises, every request of the batch gets
            the exception.
        max_batch_size: ``batchSize``.
        max_delay_s: ``maxBatchDelay`` in seconds: how long a batch may wait to fill after its
            first request, once the worker is free.
        solo: kinds that always run alone (TorchServe runs a describe request as a batch of 1).
    """

    def __init__(
        self,
        run: Callable[[Hashable, list[Any]], Awaitable[list[Any]]],
        *,
        max_batch_size: int,
        max_delay_s: float,
        solo: Collection[Hashable] = (),
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s must be >= 0, got {max_delay_s}")
        self._run = run
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self._solo = frozenset(solo)
        self._jobs: collections.deque[_Job] = collections.deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    @property
    def pending(self) -> int:
        """Requests waiting for a batch (not counting the batch being answered)."""
        return sum(not job.future.done() for job in self._jobs)

    async def submit(self, item: Any, kind: Hashable = "predict") -> Any:
        """Queue ``item`` and wait for its answer."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():  # first use, on the serving loop
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._serve(), name="handlerkit-batcher")
        future = loop.create_future()
        self._jobs.append(_Job(kind, item, future))
        assert self._arrived is not None
        self._arrived.set()
        return await future

    async def _serve(self) -> None:
        while True:
            kind, jobs = await self._next_batch()
            try:
                answers = await self._run(kind, [job.item for job in jobs])
                if len(answers) != len(jobs):
                    raise RuntimeError(f"run answered {len(answers)} items for a batch of {len(jobs)}")
            except asyncio.CancelledError:
                for job in jobs:
                    job.future.cancel()
                raise
            except BaseException as exc:  # every request of the batch gets the failure
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            for job, answer in zip(jobs, answers):
                if not job.future.done():  # its caller may have gone away meanwhile
                    job.future.set_result(answer)

    async def _next_batch(self) -> tuple[Hashable, list[_Job]]:
        """The next batch, formed as TorchServe's ``pollBatch`` forms it."""
        first = await self._take(None, None)
        assert first is not None
        batch = [first]
        if first.kind in self._solo:
            return first.kind, batch
        deadline = asyncio.get_running_loop().time() + self.max_delay_s
        while len(batch) < self.max_batch_size:
            job = await self._take(first.kind, deadline)
            if job is None:
                break
            batch.append(job)
        return first.kind, batch

    async def _take(self, kind: Hashable | None, deadline: float | None) -> _Job | None:
        """The oldest live job (of ``kind`` when given, never a solo kind then), waiting until
        ``deadline`` (loop time; None: for ever); None when the deadline passes first."""
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        while True:
            for job in list(self._jobs):
                if job.future.done():  # cancelled by its caller before its batch formed
                    self._jobs.remove(job)
                elif kind is None or (job.kind == kind and kind not in self._solo):
                    self._jobs.remove(job)
                    return job
            self._arrived.clear()
            if deadline is None:
                await self._arrived.wait()
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return None
