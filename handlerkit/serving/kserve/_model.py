"""The ``kserve.Model`` that runs one TorchServe-contract handler (imports kserve: load it only
through :func:`handlerkit.serving.kserve.model`, which checks kserve is installed first).

Each request is turned back into the HTTP request TorchServe's frontend would forward (body
bytes and headers, :func:`handlerkit.serving._http.to_request`), run as a batch of one through
the handler's entry point wrapped in the protocol's envelope (``kserve`` for v1, ``kservev2``
for v2), and answered from what the worker would send back (:func:`~handlerkit.serving._http.replies`).
A v2 request is checked against the spec first, and a v2 error answered the spec's way
(:mod:`handlerkit.serving.v2`); the v2 metadata declares the inputs and outputs the model's
config or handler declares (:func:`~handlerkit.serving.v2.declared_tensors`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from typing import Any

import kserve
from kserve.protocol.infer_type import InferRequest

from handlerkit.errors import HandlerkitError
from handlerkit.recording.failures import handler_files
from handlerkit.service import Service, WorkingDir
from handlerkit.serving._failures import batch_failure, logger
from handlerkit.serving._http import Reply, replies, to_request, worker_error, worker_failure
from handlerkit.serving.kserve._v2 import request_validation_response
from handlerkit.serving.v2 import as_v2_error, declared_tensors, input_problems, invalid_request
from handlerkit.worker.context import MockContext
from handlerkit.worker.envelopes import wrap

__all__ = ["HandlerModel", "HandlerReply"]

#: The TorchServe service envelope each KServe protocol's body goes through.
ENVELOPES = {"v1": "kserve", "v2": "kservev2"}
_JSON = "application/json"


class HandlerReply(Exception):
    """A request answered with something other than 200: its reply is sent as it is (status,
    content type, body), as TorchServe's frontend sends it (see :func:`reply_response`)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"{reply.status}: {reply.body[:200].decode('utf-8', 'replace')}")
        self.reply = reply


async def reply_response(request: Any, exc: HandlerReply) -> Any:
    """The FastAPI exception handler for :class:`HandlerReply` (registered on kserve's app by
    :meth:`HandlerModel.load`): the worker's reply, unchanged."""
    from fastapi.responses import Response

    reply = exc.reply
    return Response(content=reply.body, status_code=reply.status, headers=reply.headers)


class HandlerModel(kserve.Model):
    """A TorchServe-contract handler as a KServe model: v1 ``predict``/``explain``, v2 ``infer``."""

    def __init__(self, model: str, *, handler: Any = None, name: str | None = None, working_dir: WorkingDir = "call"):
        self.context = MockContext.from_model_dir(model)  # reads the manifest (an archive is unpacked)
        super().__init__(name or self.context.model_name, return_response_headers=True)
        self.model_path = model
        self._handler = handler
        self._working_dir: WorkingDir = working_dir
        self.service: Service | None = None
        self._entries: dict[str, Any] = {}
        self._files: frozenset[str] | None = None  # the handler's source files, read at the first failure
        self._declared: dict[str, Any] = {"inputs": [], "outputs": [], "other_names": False}  # v2 metadata
        # One thread: one handle() at a time, as one TorchServe worker; the event loop stays free.
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="handlerkit-kserve")

    # -- lifecycle ----------------------------------------------------------------------------
    def load(self) -> bool:
        """Load the handler and run ``initialize`` once; then the model is ready."""
        from fastapi.exceptions import RequestValidationError
        from kserve.model_server import app

        app.add_exception_handler(HandlerReply, reply_response)
        app.add_exception_handler(RequestValidationError, request_validation_response)
        service = Service(self._handler, self.context, working_dir=self._working_dir)
        try:
            service.initialize()
        except BaseException:
            service.close()
            raise
        self.service = service
        self._declared = declared_tensors(service.context.model_yaml_config, service.function or service.handler)
        # Both protocols share the one initialized handler: each wraps the entry point in its envelope.
        self._entries = {protocol: wrap(service.entry, envelope) for protocol, envelope in ENVELOPES.items()}
        for entry in self._entries.values():
            entry.__self__.context = service.context
        self.ready = True
        return self.ready

    def stop(self) -> None:
        """Not ready any more; the archive's temporary dir is removed (loaded or not)."""
        self.ready = False
        if self.service is not None:
            self.service.close()
            self.service = None
        else:
            archive = getattr(self.context, "archive", None)  # a .mar unpacked by from_model_dir
            if archive is not None:
                archive.cleanup()
        self._pool.shutdown(wait=False)

    # -- v2 metadata (GET /v2/models/<name>) ----------------------------------------------------
    def get_input_types(self) -> list[dict[str, Any]]:
        """The inputs the model declares (model-config.yaml's ``v2:``, else the handler's ``v2_metadata``)."""
        return self._declared["inputs"]

    def get_output_types(self) -> list[dict[str, Any]]:
        """The outputs the model declares (model-config.yaml's ``v2:``, else the handler's ``v2_metadata``)."""
        return self._declared["outputs"]

    # -- inference ----------------------------------------------------------------------------
    async def predict(
        self, payload: Any, headers: dict[str, str] | None = None, response_headers: dict[str, str] | None = None
    ) -> Any:
        return await self._run(payload, headers or {}, explain=False)

    async def explain(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        return await self._run(payload, headers or {}, explain=True)

    async def postprocess(
        self, result: Any, headers: dict[str, str] | None = None, response_headers: dict[str, str] | None = None
    ) -> Any:
        """The worker's reply as kserve sends it: v1 its body and headers (content type included);
        v2 the inference response, which kserve checks before sending; any other status as it is
        (v1: TorchServe's body; v2: the spec's ``{"error": <TorchServe's message>}``)."""
        protocol, reply = result
        if reply.status != 200:
            raise HandlerReply(as_v2_error(reply) if protocol == "v2" else reply)
        if protocol == "v2":
            return json.loads(reply.body)
        if response_headers is not None:
            response_headers.update(reply.headers)
        return reply.body

    async def _run(self, payload: Any, headers: dict[str, str], *, explain: bool) -> tuple[str, Reply]:
        if isinstance(payload, InferRequest):
            protocol, rest = "v2", _v2_body(payload)
            declared = self.get_input_types()  # a subclass's own declaration binds every name
            other_names = self._declared["other_names"] and declared is self._declared["inputs"]
            problems = input_problems(rest.get("inputs"), declared, other_names=other_names)
            if problems:  # answered alone, before the handler sees it
                return protocol, invalid_request(problems)
            body = json.dumps(rest).encode("utf-8")
        else:
            protocol, body = "v1", _v1_body(payload)
        request = to_request(headers.items(), body, explain=explain, request_id=headers.get("x-request-id"))
        loop = asyncio.get_running_loop()
        return protocol, await loop.run_in_executor(self._pool, self._handle, protocol, request)

    def _handle(self, protocol: str, request: Any) -> Reply:
        service = self.service
        if service is None:
            raise HandlerkitError(f"model {self.name!r} is not loaded", fix="call load() first (ModelServer does)")
        batch = service.bind([request])
        try:
            with service.running("handle"):
                output = self._entries[protocol](batch.data, service.context)
        except Exception as exc:
            code, message = worker_failure(exc)
            self._log_failure(service, batch, exc, f'{code} "{message}"')
            return worker_error(code, message)
        return replies(output, service.context, 1)[0]

    def _log_failure(self, service: Service, batch: Any, exc: BaseException, answer: str) -> None:
        """Log the request's StageError (stage, ``file:line``, fix) to the ``handlerkit.serving`` logger."""
        try:
            if self._files is None:
                self._files = handler_files(service.function or service.handler)
            error: Any = batch_failure(service, batch, exc, self._files)
        except Exception as failed:  # telling the failure must never cost the request its answer
            error = f"{type(exc).__name__}: {exc} (not attributed to a stage: {type(failed).__name__}: {failed})"
        rid = batch.requests[0].request_id if batch.requests else "?"
        logger.error("%s answered %s to request %s:\n%s", self.name, answer, rid, error)


def _v2_body(payload: InferRequest) -> dict[str, Any]:
    """The v2 request as the client sent it, from kserve's parsed request."""
    rest: Any = payload.to_rest()[0]  # a dict: kserve decoded any binary data into the inputs
    rest.pop("model_name", None)  # kserve adds it; a v2 client's body has none
    return rest


def _v1_body(payload: Any) -> bytes:
    """The v1 request body as the client sent it, from kserve's parsed JSON."""
    if isinstance(payload, (bytes, bytearray)):
        return bytes(payload)
    return json.dumps(payload).encode("utf-8")
