"""The Ray Serve replica that runs one TorchServe-contract handler (imports Ray: load it only
through :mod:`handlerkit.serving.ray`, which checks Ray is installed first).

One replica is one TorchServe worker: ``initialize`` once with a context built from the model
dir, then one ``handle(data, context)`` at a time, on one thread. Batches are formed when that
thread is free, as TorchServe forms them (:class:`~handlerkit.serving._batcher.Batcher`), or,
with ``batching="serve.batch"``, by Ray's ``@serve.batch`` as requests arrive. Predictions and
explanations are batched apart: TorchServe's frontend would mix them, and a handler picks
explain mode from the first request's header, so a mixed batch answers some requests with the
wrong kind.

Failures, as TorchServe's worker has them (:mod:`handlerkit.serving._failures` tells each as a
notebook does, in the replica's log):

- a batch whose ``handle`` raises is answered 503 "Prediction failed" (a ``PredictionException``
  its code, a ``MemoryError`` 507) and its StageError logged;
- a handler that cannot load fails the replica's constructor with its StageError, which the
  driver gets as data (:func:`handlerkit.serving.ray.run`); the deployment does not retry it;
- a batch still running at ``responseTimeout`` is answered 500 "Worker died.". TorchServe then
  kills the worker process and starts a new one; a thread cannot be killed, so the replica
  reports itself unhealthy (:meth:`HandlerReplica.check_health`) and Ray replaces it. Until
  then it answers 503 at once rather than queue requests behind the stuck batch (TorchServe
  queues them for the new worker).

An async handler (``asyncCommunication: true``) is served as TorchServe's async worker serves
it: each request is its own batch, awaited at once with the others on the handler's worker
loop (:meth:`Service.ahandle <handlerkit.service.Service.ahandle>`), each with its own copy of
the context; a request still running at ``responseTimeout`` is answered 500 "Worker died." and
cancelled (a coroutine can be stopped, so the replica stays healthy).

A stateful model (``sequenceBatching: true``) has its sequences admitted and ended by a
:class:`~handlerkit.serving._sequences.SequenceDesk`; each is registered with Ray's model
multiplexing (:meth:`HandlerReplica._hold`), so Ray routes its later requests here. After each
batch the handler's stopping criteria run once per answer, as in the worker's
``create_predict_response``. With ``continuousBatching: true`` too, predictions go through
TorchServe's loop (:class:`~handlerkit.serving._continuous.ContinuousLoop`): a request left
unfinished is streamed to its client an HTTP chunk per step and called again, new ones join
between steps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import datetime
import os
import sys
import threading
import time
from collections.abc import Hashable
from typing import Any, cast

import ray
from ray import serve
from starlette.requests import Request as HttpRequest
from starlette.responses import Response, StreamingResponse

from handlerkit.recording.failures import handler_files
from handlerkit.service import Service
from handlerkit.serving import _failures
from handlerkit.serving._batcher import Batcher
from handlerkit.serving._continuous import ContinuousLoop
from handlerkit.serving._failures import logger
from handlerkit.serving._http import (
    WORKER_DIED,
    Reply,
    customized_metadata,
    description,
    error_reply,
    parse_route,
    replies,
    to_request,
    worker_error,
    worker_failure,
)
from handlerkit.serving._sequences import Admitted, SequenceDesk
from handlerkit.serving._streams import Opened, StreamRouter
from handlerkit.worker.batches import Batch
from handlerkit.worker.requests import Request
from handlerkit.worker.streaming import final_stream_next

_KEEP_METRICS = 10_000  # metric records a replica keeps before dropping them
#: Sequence ids Ray keeps registered per replica (it forgets the least recent beyond); the
#: handler's own limit is maxNumSequence (handlerkit.serving._sequences).
SEQUENCES_PER_REPLICA = 100_000
SWITCH_INTERVAL_S = 0.0005  # the replica process's sys.setswitchinterval (see HandlerReplica)


class HandlerReplica:
    """A Ray Serve ingress: ``/predictions``, ``/explanations`` and ``/ping`` for one model."""

    def __init__(self, model: str, handler: Any, name: str, version: str | None, settings: dict[str, Any]) -> None:
        _failures.log_through_serve()
        self.name, self.version = name, version
        self.timeout = settings["response_timeout_s"]
        self.service = self._load(model, handler, settings)
        self.context = self.service.context
        # The worker socket's frontend end: a streaming handler's chunks go to their requests' clients.
        self._router = StreamRouter()
        self.context.cl_socket = self._router
        self._files: frozenset[str] | None = None  # the handler's source files, read at the first failure
        self._handle_thread: int | None = None  # the thread running handle() (its stack, at a timeout)
        self._stuck: str | None = None  # why this replica no longer runs batches (a timed-out one)
        # handle() shares this process's GIL with Ray's threads that receive the next requests.
        # At Python's default 5 ms switch interval, a torch op returning to Python can wait that
        # long for one of them while the cores idle; at 0.5 ms resnet18 served 6 % more requests
        # per second (benchmarks/ray_vs_torchserve.py, alternating rounds).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        # One thread: one handle() at a time, as one TorchServe worker; the event loop stays
        # free to gather the next batch meanwhile.
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="handlerkit-handle")
        self.batch_sizes: list[int] = []
        self.handle_ms: list[float] = []
        self._batcher: Batcher | None = None
        if settings.get("batching", "torchserve") == "torchserve":
            self._batcher = Batcher(
                self._kind_batch,
                max_batch_size=settings["batch_size"],
                max_delay_s=settings["batch_wait_timeout_s"],
                solo=("describe",),
            )
        else:  # Ray's @serve.batch
            # serve.batch's wrappers: their setters are not in the methods' signatures.
            for method in cast("tuple[Any, ...]", (self._predict, self._explain)):
                method.set_max_batch_size(settings["batch_size"])
                method.set_batch_wait_timeout_s(settings["batch_wait_timeout_s"])
        # sequenceBatching: the sequences this replica holds (Ray routes them here: _hold).
        self._desk = SequenceDesk.from_config(name, self.context.model_yaml_config)
        self._settle_s = float(settings.get("sequence_settle_s", 0.0))
        config = self.context.model_yaml_config or {}
        self._loop = (
            ContinuousLoop(self._gather, self._router.send, self._desk.answered, batch_size=settings["batch_size"])
            if self._desk is not None and config.get("continuousBatching")
            else None
        )
        self._fields = settings.get("describe") or {}
        self._capacity = settings.get("queue_capacity", 100)
        self._started = datetime.datetime.now(datetime.timezone.utc)

    def _load(self, model: str, handler: Any, settings: dict[str, Any]) -> Service:
        """The worker's load: open the model and its handler, run ``initialize``. A failure is
        handed to the driver as data and raised as the StageError the notebook shows."""
        service = None
        try:
            # One replica is one worker process: it runs in the model dir from here on, and takes
            # the entry point (in the envelope, if any) before initialize, as the worker does.
            # Ray sets CUDA_VISIBLE_DEVICES to the replica's GPUs, so its first GPU is cuda:0 here.
            service = Service.open(
                model,
                handler=handler,
                gpu_id=0 if ray.get_gpu_ids() else None,
                batch_size=settings["batch_size"],
                model_name=self.name,
                envelope=settings.get("envelope"),
                working_dir="process",
            )
            service.initialize()
        except Exception as exc:
            error = _failures.load_failure(exc, service)
            if service is not None:
                service.close()
            _failures.publish_load_failure(error)
            # The driver prints it (handlerkit.serving.ray.run): the replica's log file only.
            logger.error("%s could not load its handler:\n%s", self.name, error, extra={"log_to_stderr": False})
            raise error from exc
        return service

    # -- batches ---------------------------------------------------------------------------

    def _handler_files(self) -> frozenset[str]:
        if self._files is None:
            self._files = handler_files(self.service.function or self.service.handler)
        return self._files

    def _run(self, requests: list[Any]) -> list[Reply]:
        self._handle_thread = threading.get_ident()
        batch = Batch(requests)
        self.batch_sizes.append(len(batch))
        start = time.perf_counter()
        try:
            output = self.service.handle(batch)
        except BaseException as exc:  # the worker answers every request of the batch
            code, message = worker_failure(exc)
            if self._stuck is None:  # else the batch was answered "Worker died." already
                self._log_failure(batch, exc, f'{code} "{message}"')
            return [worker_error(code, message)] * len(batch)
        elapsed_ms = (time.perf_counter() - start) * 1000
        self.handle_ms.append(elapsed_ms)
        metrics = self.context.metrics
        metrics.add_time("PredictionTime", round(elapsed_ms, 2))
        if len(getattr(metrics, "records", ())) > _KEEP_METRICS and hasattr(metrics, "clear"):
            metrics.clear()  # a replica lives long: the recording store must not grow without end
        if isinstance(output, list) and len(output) == len(batch):  # as the worker's create_predict_response:
            final_stream_next(self.context, output)  # the handler's stopping criteria run once per answer
        return replies(output, self.context, len(batch))

    def _log_failure(self, batch: Batch, exc: BaseException, answer: str) -> None:
        """Log the batch's StageError (on the handler's thread, outside any request's context,
        so Serve's log line names no request: the message names them all)."""
        try:
            error: Any = _failures.batch_failure(self.service, batch, exc, self._handler_files())
        except Exception as failed:  # telling the failure must never cost the batch its answer
            error = f"{type(exc).__name__}: {exc} (not attributed to a stage: {type(failed).__name__}: {failed})"
        logger.error("%s answered %s to %s:\n%s", self.name, answer, _ids(batch.requests), error)

    async def _gather(self, requests: list[Any]) -> list[Reply]:
        if self._stuck is not None:  # being replaced: answer now rather than queue behind the stuck batch
            return [error_reply(503, self._stuck, "ServiceUnavailableException")] * len(requests)
        future = asyncio.wrap_future(self._pool.submit(self._run, requests))
        try:
            return await asyncio.wait_for(future, self.timeout)
        except asyncio.TimeoutError:
            self._stuck = (
                f'Model "{self.name}" has no worker to serve inference request: its worker ran past '
                f"responseTimeout ({self.timeout:g} s) and is being replaced; retry shortly"
            )
            try:
                error: Any = _failures.timeout_failure(
                    self.service, self._handle_thread, self.timeout, self._handler_files()
                )
            except Exception as failed:  # the answer and the replacement matter more than the report
                error = f"no answer within responseTimeout (not attributed: {type(failed).__name__}: {failed})"
            logger.error(
                '%s answered 500 "Worker died." to %s; this replica now reports itself unhealthy, so that '
                "Ray replaces it, as TorchServe kills and restarts a worker that runs past responseTimeout:\n%s",
                self.name,
                _ids(requests),
                error,
            )
            return [WORKER_DIED] * len(requests)

    async def _await_one(self, request: Any) -> Reply:
        """One request as the async worker runs it: a batch of its own, awaited concurrently."""
        batch = Batch([request])
        # As the async worker: a deep copy of the context per batch (its own request ids, headers,
        # response statuses and metrics), sharing the one socket, whose frames name their requests.
        context = copy.deepcopy(self.context, {id(self._router): self._router})
        context.cl_socket = self._router
        try:
            output = await asyncio.wait_for(self.service.ahandle(batch, context=context), self.timeout)
        except asyncio.TimeoutError:
            logger.error(
                '%s answered 500 "Worker died." to %s: no answer within responseTimeout (%g s); its coroutine '
                "was cancelled",
                self.name,
                _ids(batch.requests),
                self.timeout,
            )
            return WORKER_DIED
        except Exception as exc:  # the async worker answers the batch, as the synchronous one
            code, message = worker_failure(exc)
            self._log_failure(batch, exc, f'{code} "{message}"')
            return worker_error(code, message)
        if isinstance(output, list) and len(output) == 1:
            final_stream_next(context, output)
        return replies(output, context, 1)[0]

    async def check_health(self) -> None:
        """Ray Serve's health check: a replica whose handler ran past ``responseTimeout`` is
        unhealthy, and Ray replaces it (its thread cannot be stopped)."""
        if self._stuck is not None:
            raise RuntimeError(f"handlerkit: {self._stuck}")

    async def _kind_batch(self, kind: Hashable, requests: list[Any]) -> list[Reply]:
        return await self._gather(requests)

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def _predict(self, requests: list[Any]) -> list[Reply]:
        return await self._gather(requests)

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def _explain(self, requests: list[Any]) -> list[Reply]:
        return await self._gather(requests)

    # -- HTTP ------------------------------------------------------------------------------

    async def __call__(self, http: HttpRequest) -> Response:
        path, root = http.scope.get("path", "/"), http.scope.get("root_path", "")
        route = parse_route(path[len(root) :] if root and path.startswith(root) else path)
        if route.kind == "ping":  # TorchServe answers 500 "Unhealthy" while its worker restarts
            code, status = (500, b"Unhealthy") if self._stuck is not None else (200, b"Healthy")
            return _response(
                Reply(code, None, {"content-type": "application/json"}, b'{\n  "status": "%s"\n}' % status)
            )
        if route.kind == "unknown":
            return _response(
                error_reply(
                    404, "Requested resource is not found, please refer to API document.", "ResourceNotFoundException"
                )
            )
        if route.kind == "describe" and http.method != "GET":
            return _response(
                error_reply(
                    405,
                    "only GET /models/<model> of TorchServe's management API is served here",
                    "MethodNotAllowedException",
                )
            )
        if route.model != self.name:
            return _response(error_reply(404, f"Model not found: {route.model}", "ModelNotFoundException"))
        if route.version is not None and self.version is not None and route.version != self.version:
            return _response(
                error_reply(
                    404,
                    f"Model version: {route.version} does not exist for model: {self.name}",
                    "ModelVersionNotFoundException",
                )
            )
        if route.kind == "describe":
            return _response(await self._describe(http))
        body = await http.body()
        # Ray's proxy gives each request an id (the client's x-request-id, if it sent one), logs
        # it and sends it back: the handler's context and the replica's log use the same one.
        ray_id = http.headers.get("x-request-id")
        headers, opens, sequence_id = list(http.headers.items()), False, None
        if self._desk is not None and route.kind == "predict":
            admitted = self._desk.admit(headers)
            if not isinstance(admitted, Admitted):
                return _response(admitted)
            await self._hold(admitted.sequence_id)
            headers, opens = headers + list(admitted.headers.items()), admitted.opened
            sequence_id = admitted.sequence_id
        try:
            request = to_request(
                headers,
                body,
                query=http.query_params.multi_items(),
                explain=route.kind == "explain",
                url_path=route.url_path,
                request_id=ray_id,
            )
        except ValueError as exc:
            return _response(error_reply(400, str(exc)))
        queue = self._router.open(request.request_id)  # before its batch can run: no chunk is missed
        answer = asyncio.ensure_future(self._answer(request, route.kind, sequence_id))
        try:
            opened = await self._router.answer(request.request_id, queue, answer)
        except asyncio.CancelledError:  # the client went away: drop its request, as a cancelled await did
            answer.cancel()
            raise
        if opens:  # a sequence's first answer waits until Ray routes its id here (see _sequences)
            await asyncio.sleep(self._settle_s)
        return _response(opened, None if ray_id else request.request_id)

    async def _answer(self, request: Request, kind: str, sequence_id: str | None = None) -> Reply:
        if self._loop is not None and sequence_id is not None:
            reply = await self._loop.submit(request, sequence_id)
        elif self.service.asynchronous:
            reply = await self._await_one(request)
        elif self._batcher is not None:
            reply = cast("Reply", await self._batcher.submit(request, kind))
        else:
            reply = await (self._explain if kind == "explain" else self._predict)(request)
        if self._desk is not None:
            self._desk.answered(reply.headers)
        return reply

    @serve.multiplexed(max_num_models_per_replica=SEQUENCES_PER_REPLICA)
    async def _hold(self, sequence_id: str) -> str:
        """Ray Serve's model multiplexing, with a sequence id as the model id: Ray routes later
        requests carrying ``serve_multiplexed_model_id: <id>`` to this replica."""
        return sequence_id

    async def _describe(self, http: HttpRequest) -> Reply:
        """TorchServe's ``GET /models/<m>[?customized=true]``, the handler asked through the queue."""
        customized = None
        if http.query_params.get("customized", "").lower() == "true":
            request = Request((), {**dict(http.headers.items()), "describe": "True"})
            if self._batcher is not None:
                reply = await self._batcher.submit(request, "describe")
            else:
                (reply,) = await self._gather([request])
            if reply.status >= 400:
                return reply
            customized = customized_metadata(reply.body)
        pending = self._batcher.pending if self._batcher is not None else 0
        return description(
            self._fields, worker=self._worker(), pending=pending, capacity=self._capacity, customized=customized
        )

    def _worker(self) -> dict[str, Any]:
        """This replica as TorchServe lists a worker."""
        try:
            replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a replica (tests of the class itself)
            replica_id = str(os.getpid())
        started = self._started.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self._started.microsecond // 1000:03d}Z"
        return {
            "id": replica_id,
            "startTime": started,
            "status": "READY",
            "memoryUsage": _rss_bytes(),
            "pid": os.getpid(),
            "gpu": self.context.system_properties.get("gpu_id") is not None,
            "gpuUsage": "N/A",
        }

    def stats(self) -> dict[str, Any]:
        """The batch sizes this replica ran and how long each ``handle`` took (ms), each
        continuous-batching step's request ids, its pid and thread settings (for tests and the
        benchmark)."""
        import torch

        return {
            "batch_sizes": list(self.batch_sizes),
            "steps": [list(step) for step in self._loop.steps] if self._loop is not None else [],
            "handle_ms": list(self.handle_ms),
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "switch_interval": sys.getswitchinterval(),
        }


def _ids(requests: Any) -> str:
    """``request 1f2e…`` or ``requests 1f2e…, 9a8b…`` (the ids clients get as x-request-id)."""
    ids = [getattr(r, "request_id", "?") for r in requests]
    return f"request{'s' if len(ids) != 1 else ''} {', '.join(ids)}"


def _rss_bytes() -> int:
    """This process's resident memory, or 0 where /proc does not say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def _response(reply: Reply | Opened, request_id: str | None = None) -> Response:
    """Starlette's answer: a full response, or a stream's (one HTTP chunk per send; Ray Serve
    streams it through its proxy to the client as it comes)."""
    if isinstance(reply, Opened):
        if reply.reply is not None:
            return _response(reply.reply, request_id)
        assert reply.body is not None  # a stream
        headers = dict(reply.headers)
        media = headers.pop("content-type", None)
        if request_id is not None:
            headers.setdefault("x-request-id", request_id)
        return StreamingResponse(reply.body, status_code=reply.status, headers=headers, media_type=media)
    headers = dict(reply.headers)
    media = headers.pop("content-type", None) or headers.pop("Content-Type", None)
    if request_id is not None:
        headers.setdefault("x-request-id", request_id)
    return Response(reply.body, status_code=reply.status, headers=headers, media_type=media)
