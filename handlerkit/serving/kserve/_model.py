"""The ``kserve.Model`` that runs one TorchServe-contract handler: a thin transport on the
frontend (imports kserve: load it only through :func:`handlerkit.serving.kserve.model`, which
checks kserve is installed first).

Each request is turned back into the HTTP request TorchServe's frontend would forward (body
bytes and headers, :func:`handlerkit.serving._http.to_request`) and handed to the model's
:class:`~handlerkit.serving.frontend.Frontend` with the protocol's envelope (``kserve`` for v1,
``kservev2`` for v2): batched as ``model-config.yaml`` says (``batchSize``,
``maxBatchDelay``), run on the one handle thread, timed out at ``responseTimeout``, its
failures answered and logged there, as on every engine. A v1 ``:predict`` whose handler streams
(``send_intermediate_predict_response``) is streamed to its client, one HTTP chunk per send
(kserve streams a v1 answer; its v2 route cannot). A v2 request is checked against the spec
first, and a v2 error answered the spec's way (:mod:`handlerkit.serving.v2`); the v2 metadata
declares the inputs and outputs the model's config or handler declares
(:func:`~handlerkit.serving.v2.declared_tensors`).
"""

from __future__ import annotations

import json
from typing import Any

import kserve
from kserve.protocol.infer_type import InferRequest

from handlerkit.errors import HandlerkitError
from handlerkit.service import Service, WorkingDir
from handlerkit.serving._http import Reply, to_request
from handlerkit.serving.frontend import Frontend, Job, settings
from handlerkit.serving.frontend.streams import Opened
from handlerkit.serving.kserve._v2 import request_validation_response
from handlerkit.serving.v2 import as_v2_error, declared_tensors, input_problems, invalid_request
from handlerkit.worker.config import parse_config
from handlerkit.worker.context import MockContext

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
        self.frontend: Frontend | None = None
        self._declared: dict[str, Any] = {"inputs": [], "outputs": [], "other_names": False}  # v2 metadata

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
        # Both protocols share the one initialized handler, each request through its protocol's envelope.
        config = parse_config(self.context.model_yaml_config, source=f"{self.model_path} model config")
        self.frontend = Frontend(
            service, name=self.name, settings=settings(config), envelopes=tuple(ENVELOPES.values())
        )
        self._declared = declared_tensors(service.context.model_yaml_config, service.function or service.handler)
        self.ready = True
        return self.ready

    def stop(self) -> None:
        """Not ready any more; the archive's temporary dir is removed (loaded or not)."""
        self.ready = False
        if self.frontend is not None:
            self.frontend.close()
            self.frontend = None
        if self.service is not None:
            self.service.close()
            self.service = None
        else:
            archive = getattr(self.context, "archive", None)  # a .mar unpacked by from_model_dir
            if archive is not None:
                archive.cleanup()

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
        """The worker's reply as kserve sends it: v1 its body and headers (content type included),
        or the stream of a handler that streamed; v2 the inference response, which kserve checks
        before sending; any other status as it is (v1: TorchServe's body; v2: the spec's
        ``{"error": <TorchServe's message>}``)."""
        protocol, reply = result
        if isinstance(reply, Opened):
            if reply.reply is None:  # a stream: kserve sends each chunk as it comes
                return reply.body
            reply = reply.reply
        if reply.status != 200:
            raise HandlerReply(as_v2_error(reply) if protocol == "v2" else reply)
        if protocol == "v2":
            return json.loads(reply.body)
        if response_headers is not None:
            response_headers.update(reply.headers)
        return reply.body

    async def _run(self, payload: Any, headers: dict[str, str], *, explain: bool) -> tuple[str, Reply | Opened]:
        frontend = self.frontend
        if frontend is None:
            raise HandlerkitError(f"model {self.name!r} is not loaded", fix="call load() first (ModelServer does)")
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
        job = Job("explain" if explain else "predict", ENVELOPES[protocol])
        # kserve streams a v1 predict answer (an async iterator), not a v2 one nor an explanation.
        streams = protocol == "v1" and not explain
        answer = await (frontend.answer(request, job) if streams else frontend.reply(request, job))
        if frontend.stuck is not None:  # a batch ran past responseTimeout: not ready, so the pod is replaced
            self.ready = False
        return protocol, answer


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
