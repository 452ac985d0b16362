"""How requests become batches: the dispatch strategies of TorchServe's frontend (engine-free).

Each strategy is one small object with one method, ``await submit(request, job)`` → the
request's :class:`~handlerkit.serving._http.Reply`; a model's frontend composes the ones its
config asks for, once (:class:`~handlerkit.serving.frontend.model.Frontend`), and an engine may
bring its own base (Ray's ``@serve.batch``) in place of TorchServe's batching:

- :class:`BatchDispatch`: batches formed when the handle thread is free, as TorchServe's
  ``pollBatch`` forms them (``batchSize``, ``maxBatchDelay``:
  :class:`~handlerkit.serving.frontend.batcher.Batcher`); predictions, explanations and each envelope's
  requests apart, a describe request alone;
- :class:`AsyncDispatch`: ``asyncCommunication: true``, each request a batch of its own,
  awaited at once with the others, as TorchServe's async worker;
- :class:`SequenceDispatch`: ``sequenceBatching: true``, around another: an answer's
  ``ts_request_sequence_end`` closes its sequences at the desk
  (:class:`~handlerkit.serving.frontend.sequence_desk.SequenceDesk`);
- :class:`ContinuousDispatch`: ``continuousBatching: true`` too, a sequence's predictions go
  through TorchServe's continuous-batching loop
  (:class:`~handlerkit.serving.frontend.continuous.ContinuousLoop`); the rest to the one it wraps.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

from handlerkit.serving._http import Reply
from handlerkit.serving.frontend.batcher import Batcher
from handlerkit.serving.frontend.continuous import ContinuousLoop

if TYPE_CHECKING:
    from handlerkit.serving.frontend.handle_thread import HandleThread
    from handlerkit.serving.frontend.sequence_desk import SequenceDesk
    from handlerkit.worker.requests import Request

__all__ = ["AsyncDispatch", "BatchDispatch", "ContinuousDispatch", "Dispatch", "Job", "SequenceDispatch"]


class Job(NamedTuple):
    """What the frontend knows of a request besides the request: its route's ``kind``
    (``"predict"``, ``"explain"``, ``"describe"``), the service ``envelope`` its body goes
    through (None: the handler's own entry point), and its sequence (None: none)."""

    kind: str = "predict"
    envelope: str | None = None
    sequence_id: str | None = None


class Dispatch(Protocol):
    """A dispatch strategy: answers each request submitted, from some batch."""

    async def submit(self, request: Request, job: Job) -> Reply: ...

    @property
    def pending(self) -> int:
        """Requests waiting for a batch."""
        ...


class BatchDispatch:
    """TorchServe's batching: a batch forms when the handle thread is free (see the module docs)."""

    def __init__(self, thread: HandleThread, *, batch_size: int, max_delay_s: float) -> None:
        self._thread = thread
        self._batcher = Batcher(
            self._run, max_batch_size=batch_size, max_delay_s=max_delay_s, solo=[("describe", None)]
        )

    async def _run(self, key: Hashable, requests: list[Request]) -> list[Reply]:
        _kind, envelope = cast("tuple[str, str | None]", key)
        return await self._thread.gather(requests, envelope)

    async def submit(self, request: Request, job: Job) -> Reply:
        return cast("Reply", await self._batcher.submit(request, (job.kind, job.envelope)))

    @property
    def pending(self) -> int:
        return self._batcher.pending


class AsyncDispatch:
    """The async worker's way: each request its own batch, all awaited at once. A request
    through an envelope runs on the handle thread (the envelope is synchronous)."""

    def __init__(self, thread: HandleThread) -> None:
        self._thread = thread
        self._waiting = 0

    async def submit(self, request: Request, job: Job) -> Reply:
        self._waiting += 1
        try:
            if job.envelope is None:
                return await self._thread.await_one(request)
            (reply,) = await self._thread.gather([request], job.envelope)
            return reply
        finally:
            self._waiting -= 1

    @property
    def pending(self) -> int:
        return 0  # none waits for a batch: each is awaited at once


class SequenceDispatch:
    """Sequences around ``inner``: each answer's ``ts_request_sequence_end`` closes its sequences."""

    def __init__(self, inner: Dispatch, desk: SequenceDesk) -> None:
        self._inner, self.desk = inner, desk

    async def submit(self, request: Request, job: Job) -> Reply:
        reply = await self._inner.submit(request, job)
        self.desk.answered(reply.headers)
        return reply

    @property
    def pending(self) -> int:
        return self._inner.pending


class ContinuousDispatch:
    """A sequence's predictions through the continuous-batching ``loop`` (which closes the
    sequences its answers end); everything else through ``inner``."""

    def __init__(self, inner: Dispatch, loop: ContinuousLoop) -> None:
        self._inner, self.loop = inner, loop

    async def submit(self, request: Request, job: Job) -> Reply:
        if job.sequence_id is None or job.kind != "predict":
            return await self._inner.submit(request, job)
        return await self.loop.submit(request, job.sequence_id)

    @property
    def pending(self) -> int:
        return self._inner.pending
