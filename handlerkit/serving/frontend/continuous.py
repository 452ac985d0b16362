"""Continuous batching on a serving replica, as TorchServe 0.12 runs it for a stateful model
(``sequenceBatching`` and ``continuousBatching``: ``SequenceContinuousBatching``; engine-free:
no Ray import).

One loop per replica calls the handler step after step while any request is queued or running:

- each step's batch is formed by the frontend's rule (:mod:`handlerkit.worker.sequence_batches`): the
  requests still running first, re-sent without parameters, then at most one new request per
  sequence in the order the sequences opened, up to ``2 * batchSize``. Requests that arrive
  while a step runs join at the next one;
- a request whose answer says ``ts_stream_next: "true"`` (the worker's stopping criteria ran
  on it) is left unfinished: that answer goes to its client as one HTTP chunk (the first opens
  the HTTP answer, with that answer's status and headers) and it stays in the running batch;
  any other answer is its final one and ends its client's stream (or is its whole answer);
- an answer's ``ts_request_sequence_end`` ends those sequences: their queued requests never
  run, and are answered 503 (:class:`handlerkit.Sequences` marks them ``dropped``);
- a failed step (the handler raised, timed out, answered badly) answers every request in it
  with the failure and ends them, as the frontend's ``cleanJobs``; a client that went away
  leaves at the next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import NamedTuple

from handlerkit.serving._http import Reply, error_reply
from handlerkit.worker.requests import Request
from handlerkit.worker.sequence_batches import capacity, next_batch, resent

__all__ = ["ContinuousLoop"]

logger = logging.getLogger("handlerkit.serving")

STREAM_NEXT = "ts_stream_next"


class _Job(NamedTuple):
    request: Request
    sequence_id: str
    answer: asyncio.Future[Reply]


class ContinuousLoop:
    """The replica's continuous-batching loop (see the module docs).

    Args:
        run: answers one batch (a reply per request; failures as failed replies).
        stream: sends an unfinished request's step answer to its client as one HTTP chunk.
        ended: the sequences an answer's headers end (the replica's desk forgets them).
        batch_size: the model config's ``batchSize``.
    """

    def __init__(
        self,
        run: Callable[[list[Request]], Awaitable[list[Reply]]],
        stream: Callable[[str, Reply], None],
        ended: Callable[[Mapping[str, str]], list[str]],
        *,
        batch_size: int,
    ) -> None:
        self._run, self._stream, self._ended = run, stream, ended
        self.size = capacity(max(1, batch_size), continuous=True)
        self._queues: dict[str, deque[_Job]] = {}  # per sequence, in the order they opened
        self._running: list[_Job] = []
        self._stepping = False
        self._task: asyncio.Future[None] | None = None  # the running loop (held: asyncio keeps weak references)
        #: Each step's request ids, in batch order (for tests and the notebook's picture).
        self.steps: list[list[str]] = []

    def submit(self, request: Request, sequence_id: str) -> asyncio.Future[Reply]:
        """Queue ``request`` in its sequence; its final answer (call on the serving loop)."""
        answer: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(sequence_id, deque()).append(_Job(request, sequence_id, answer))
        if not self._stepping:
            self._stepping = True
            self._task = asyncio.ensure_future(self._steps())
        return answer

    async def _steps(self) -> None:
        try:
            while True:
                self._running = [job for job in self._running if not job.answer.done()]  # clients gone
                for sequence_id, queue in list(self._queues.items()):
                    kept = deque(job for job in queue if not job.answer.done())
                    if kept:
                        self._queues[sequence_id] = kept
                    else:
                        del self._queues[sequence_id]
                continued, joining = next_batch(self._running, self._queues.values(), self.size)
                if not continued and not joining:
                    return
                self._running = continued + joining  # the batch in the worker (answered if the loop breaks)
                await self._step(continued, joining)
        except Exception as exc:  # never leave a client waiting on a loop that stopped
            logger.exception("handlerkit: the continuous-batching loop stopped; its requests are answered 503")
            failure = error_reply(503, f"the continuous-batching loop stopped: {type(exc).__name__}: {exc}")
            for job in self._running + [j for q in self._queues.values() for j in q]:
                if not job.answer.done():
                    job.answer.set_result(failure)
            self._running, self._queues = [], {}
        finally:
            self._stepping = False

    async def _step(self, continued: list[_Job], joining: list[_Job]) -> None:
        jobs = continued + joining
        batch = [resent(job.request) for job in continued] + [job.request for job in joining]
        self.steps.append([request.request_id for request in batch])
        replies = await self._run(batch)
        still: list[_Job] = []
        for job, reply in zip(jobs, replies, strict=True):
            for sequence_id in self._ended(reply.headers):
                for dropped in self._queues.pop(sequence_id, deque()):
                    if not dropped.answer.done():
                        dropped.answer.set_result(
                            error_reply(
                                503,
                                f"sequence {sequence_id} ended before this request ran (the handler answered "
                                "ts_request_sequence_end); send it again to open the sequence anew",
                                "ServiceUnavailableException",
                            )
                        )
            if job.answer.done():  # its client went away
                continue
            if not reply.failed and reply.headers.get(STREAM_NEXT) == "true":
                self._stream(job.request.request_id, reply)
                still.append(job)
            else:
                job.answer.set_result(reply)
        self._running = still
