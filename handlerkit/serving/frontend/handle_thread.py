"""The one thread that runs ``handle``, as one TorchServe worker (``WorkerThread``): batches in,
replies out, failures answered and told once (engine-free).

- one ``handle(data, context)`` at a time, on one thread, so the serving event loop stays free
  to gather the next batch meanwhile;
- a batch whose ``handle`` raises is answered as the worker answers it (503 "Prediction
  failed", a ``PredictionException`` its code, a ``MemoryError`` 507:
  :func:`~handlerkit.serving._http.worker_failure`) and its
  :class:`~handlerkit.errors.StageError` is logged once, to the ``handlerkit.serving`` logger;
- a batch still running at ``responseTimeout`` is answered 500 "Worker died.". TorchServe then
  kills the worker process and starts a new one; a thread cannot be killed, so the thread is
  :attr:`HandleThread.stuck` from then on: it answers 503 at once rather than queue requests
  behind the stuck batch, and the transport reports itself unhealthy so that its engine
  replaces it;
- an async handler's request (``asyncCommunication: true``) is a batch of its own awaited on
  the handler's worker loop with its own copy of the context (:meth:`HandleThread.await_one`);
  one still running at ``responseTimeout`` is cancelled (a coroutine can be stopped).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from handlerkit.recording.failures import handler_files
from handlerkit.serving._http import WORKER_DIED, Reply, error_reply, replies, worker_error, worker_failure
from handlerkit.serving.frontend import failure_answers as _failures
from handlerkit.serving.frontend.enveloped import Enveloped
from handlerkit.serving.frontend.failure_answers import logger
from handlerkit.worker.batches import Batch
from handlerkit.worker.streaming import final_stream_next

if TYPE_CHECKING:
    from handlerkit.service import Service

__all__ = ["HandleThread"]

_KEEP_METRICS = 10_000  # metric records kept before dropping them (a server lives long)


class HandleThread:
    """Runs a :class:`~handlerkit.service.Service`'s batches one at a time on one thread.

    Args:
        service: the model, its handler initialized.
        name: the model name (in the log).
        timeout_s: ``responseTimeout`` in seconds.
        envelopes: service envelope names a batch may be run through (``"kserve"`` …), besides
            the service's own entry point: one :class:`Enveloped` entry each, kept for the
            model's lifetime as the worker keeps its envelope.
    """

    def __init__(self, service: Service, *, name: str, timeout_s: float, envelopes: Sequence[str] = ()) -> None:
        self.service, self.name, self.timeout_s = service, name, timeout_s
        self.context = service.context
        self._entries: Mapping[str, Callable[[Any, Any], Any]] = {
            envelope: Enveloped(service.entry, envelope) for envelope in envelopes
        }
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="handlerkit-handle")
        self._thread: int | None = None  # the thread running handle() (its stack, at a timeout)
        self._files: frozenset[str] | None = None  # the handler's source files, read at the first failure
        #: Why no batch runs any more (a batch ran past responseTimeout); None while healthy.
        self.stuck: str | None = None
        #: The size of each batch run, and how long each ``handle`` took (ms).
        self.batch_sizes: list[int] = []
        self.handle_ms: list[float] = []

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    # -- one batch, on the thread ------------------------------------------------------------
    def run(self, requests: list[Any], envelope: str | None = None) -> list[Reply]:
        """Answer one batch (call on the handle thread: :meth:`gather` does)."""
        self._thread = threading.get_ident()
        service = self.service
        batch = Batch(requests)
        self.batch_sizes.append(len(batch))
        start = time.perf_counter()
        try:
            if envelope is None:
                output = service.handle(batch)
            else:
                service.bind(batch)
                with service.running("handle"):
                    output = self._entries[envelope](batch.data, self.context)
        except BaseException as exc:  # the worker answers every request of the batch
            code, message = worker_failure(exc)
            if self.stuck is None:  # else the batch was answered "Worker died." already
                self.log_failure(batch, exc, f'{code} "{message}"')
            return [worker_error(code, message)] * len(batch)
        elapsed_ms = (time.perf_counter() - start) * 1000
        self.handle_ms.append(elapsed_ms)
        metrics = self.context.metrics
        metrics.add_time("PredictionTime", round(elapsed_ms, 2))
        if len(getattr(metrics, "records", ())) > _KEEP_METRICS and hasattr(metrics, "clear"):
            metrics.clear()  # the recording store must not grow without end
        if isinstance(output, list) and len(output) == len(batch):  # as the worker's create_predict_response:
            final_stream_next(self.context, output)  # the handler's stopping criteria run once per answer
        return replies(output, self.context, len(batch))

    def _handler_files(self) -> frozenset[str]:
        if self._files is None:
            self._files = handler_files(self.service.function or self.service.handler)
        return self._files

    def log_failure(self, batch: Batch, exc: BaseException, answer: str) -> None:
        """Log the batch's StageError, once (outside any request's context, so an engine's log
        line names no request: the message names them all)."""
        try:
            error: Any = _failures.batch_failure(self.service, batch, exc, self._handler_files())
        except Exception as failed:  # telling the failure must never cost the batch its answer
            error = f"{type(exc).__name__}: {exc} (not attributed to a stage: {type(failed).__name__}: {failed})"
        logger.error("%s answered %s to %s:\n%s", self.name, answer, ids(batch.requests), error)

    # -- from the serving loop -----------------------------------------------------------------
    async def gather(self, requests: list[Any], envelope: str | None = None) -> list[Reply]:
        """One batch's replies, run on the thread; "Worker died." past ``responseTimeout``."""
        if self.stuck is not None:  # being replaced: answer now rather than queue behind the stuck batch
            return [error_reply(503, self.stuck, "ServiceUnavailableException")] * len(requests)
        future = asyncio.wrap_future(self._pool.submit(self.run, requests, envelope))
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except asyncio.TimeoutError:
            self.stuck = (
                f'Model "{self.name}" has no worker to serve inference request: its worker ran past '
                f"responseTimeout ({self.timeout_s:g} s) and is being replaced; retry shortly"
            )
            try:
                error: Any = _failures.timeout_failure(
                    self.service, self._thread, self.timeout_s, self._handler_files()
                )
            except Exception as failed:  # the answer and the replacement matter more than the report
                error = f"no answer within responseTimeout (not attributed: {type(failed).__name__}: {failed})"
            logger.error(
                '%s answered 500 "Worker died." to %s; it now reports itself unhealthy, so that its engine '
                "replaces it, as TorchServe kills and restarts a worker that runs past responseTimeout:\n%s",
                self.name,
                ids(requests),
                error,
            )
            return [WORKER_DIED] * len(requests)

    async def await_one(self, request: Any) -> Reply:
        """One request as the async worker runs it: a batch of its own, awaited concurrently."""
        batch = Batch([request])
        # As the async worker: a deep copy of the context per batch (its own request ids, headers,
        # response statuses and metrics), sharing the one socket, whose frames name their requests.
        socket = getattr(self.context, "cl_socket", None)
        context = copy.deepcopy(self.context, {id(socket): socket})
        context.cl_socket = socket
        try:
            output = await asyncio.wait_for(self.service.ahandle(batch, context=context), self.timeout_s)
        except asyncio.TimeoutError:
            logger.error(
                '%s answered 500 "Worker died." to %s: no answer within responseTimeout (%g s); its coroutine '
                "was cancelled",
                self.name,
                ids(batch.requests),
                self.timeout_s,
            )
            return WORKER_DIED
        except Exception as exc:  # the async worker answers the batch, as the synchronous one
            code, message = worker_failure(exc)
            self.log_failure(batch, exc, f'{code} "{message}"')
            return worker_error(code, message)
        if isinstance(output, list) and len(output) == 1:
            final_stream_next(context, output)
        return replies(output, context, 1)[0]


def ids(requests: Any) -> str:
    """``request 1f2e…`` or ``requests 1f2e…, 9a8b…`` (the ids clients get as x-request-id)."""
    names = [getattr(r, "request_id", "?") for r in requests]
    return f"request{'s' if len(names) != 1 else ''} {', '.join(names)}"
