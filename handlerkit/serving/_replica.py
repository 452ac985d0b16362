from __future__ import annotations

import asyncio
import datetime
import os
import sys
from typing import Any, cast

import ray
from ray import serve
from starlette.requests import Request as HttpRequest
from starlette.responses import Response, StreamingResponse

from handlerkit.service import Service
from handlerkit.serving._http import Reply, description, error_reply, parse_route, to_request
from handlerkit.serving.frontend import Frontend, HandleThread, Job, Settings
from handlerkit.serving.frontend import failure_answers as _failures
from handlerkit.serving.frontend.failure_answers import logger
from handlerkit.serving.frontend.sequence_desk import Admitted
from handlerkit.serving.frontend.streams import Opened
from handlerkit.worker.memory import rss_bytes
from handlerkit.worker.requests import Request

#: Sequence ids Ray keeps registered per replica (it forgets the least recent beyond); the
#: handler's own limit is maxNumSequence (handlerkit.serving.frontend.sequence_desk).
SEQUENCES_PER_REPLICA = 100_000
SWITCH_INTERVAL_S = 0.0005  # the replica process's sys.setswitchinterval (see HandlerReplica)


class HandlerReplica:
    """A Ray Serve ingress: ``/predictions``, ``/explanations`` and ``/ping`` for one model."""

    def __init__(self, model: str, handler: Any, name: str, version: str | None, settings: dict[str, Any]) -> None:
        _failures.log_through_serve()
        self.name, self.version = name, version
        self.service = self._load(model, handler, settings)
        self.context = self.service.context
        # handle() shares this process's GIL with Ray's threads that receive the next requests.
        # At Python's default 5 ms switch interval, a torch op returning to Python can wait that
        # long for one of them while the cores idle; at 0.5 ms resnet18 served 6 % more requests
        # per second (benchmarks/ray_vs_torchserve.py, alternating rounds).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        serve_batch = settings.get("batching", "torchserve") != "torchserve"
        if serve_batch:  # Ray's @serve.batch
            # serve.batch's wrappers: their setters are not in the methods' signatures.
            for method in cast("tuple[Any, ...]", (self._predict, self._explain)):
                method.set_max_batch_size(settings["batch_size"])
                method.set_batch_wait_timeout_s(settings["batch_wait_timeout_s"])
        self.frontend = Frontend(
            self.service,
            name=name,
            settings=Settings(settings["batch_size"], settings["batch_wait_timeout_s"], settings["response_timeout_s"]),
            base=(lambda thread: ServeBatch(self, thread)) if serve_batch else None,
        )
        self._settle_s = float(settings.get("sequence_settle_s", 0.0))
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

    async def check_health(self) -> None:
        """Ray Serve's health check: a replica whose handler ran past ``responseTimeout`` is
        unhealthy, and Ray replaces it (its thread cannot be stopped)."""
        if self.frontend.stuck is not None:
            raise RuntimeError(f"handlerkit: {self.frontend.stuck}")

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def _predict(self, requests: list[Any]) -> list[Reply]:
        return await self.frontend.thread.gather(requests)

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def _explain(self, requests: list[Any]) -> list[Reply]:
        return await self.frontend.thread.gather(requests)

    # -- HTTP ------------------------------------------------------------------------------

    async def __call__(self, http: HttpRequest) -> Response:
        path, root = http.scope.get("path", "/"), http.scope.get("root_path", "")
        route = parse_route(path[len(root) :] if root and path.startswith(root) else path)
        if route.kind == "ping":  # TorchServe answers 500 "Unhealthy" while its worker restarts
            code, status = (500, b"Unhealthy") if self.frontend.stuck is not None else (200, b"Healthy")
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
        if route.kind == "predict":
            admitted = self.frontend.admit(headers)
            if isinstance(admitted, Reply):
                return _response(admitted)
            if isinstance(admitted, Admitted):
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
        opened = await self.frontend.answer(request, Job(route.kind, sequence_id=sequence_id))
        if opens:  # a sequence's first answer waits until Ray routes its id here (see _sequences)
            await asyncio.sleep(self._settle_s)
        return _response(opened, None if ray_id else request.request_id)

    @serve.multiplexed(max_num_models_per_replica=SEQUENCES_PER_REPLICA)
    async def _hold(self, sequence_id: str) -> str:
        """Ray Serve's model multiplexing, with a sequence id as the model id: Ray routes later
        requests carrying ``serve_multiplexed_model_id: <id>`` to this replica."""
        return sequence_id

    async def _describe(self, http: HttpRequest) -> Reply:
        """TorchServe's ``GET /models/<m>[?customized=true]``, the handler asked through the queue."""
        customized = None
        if http.query_params.get("customized", "").lower() == "true":
            customized = await self.frontend.customized(dict(http.headers.items()))
            if isinstance(customized, Reply):  # the describe request failed
                return customized
        return description(
            self._fields,
            worker=self._worker(),
            pending=self.frontend.pending,
            capacity=self._capacity,
            customized=customized,
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
            "memoryUsage": rss_bytes() or 0,
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
            **self.frontend.stats(),
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "switch_interval": sys.getswitchinterval(),
        }


class ServeBatch:
    """Ray's ``@serve.batch`` as the frontend's batching strategy (``batching="serve.batch"``):
    batches close as requests arrive, whether or not the handler is free; a describe request
    runs alone."""

    def __init__(self, replica: HandlerReplica, thread: HandleThread) -> None:
        self._replica, self._thread = replica, thread

    async def submit(self, request: Request, job: Job) -> Reply:
        if job.kind == "describe":
            (reply,) = await self._thread.gather([request])
            return reply
        # serve.batch's wrapper takes one request and answers its reply (its signature says a list).
        batched: Any = self._replica._explain if job.kind == "explain" else self._replica._predict
        return await batched(request)

    @property
    def pending(self) -> int:
        return 0  # Ray's queue, not counted here


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
