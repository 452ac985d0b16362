"""HTTP to TorchServe's worker view and back, for any engine that serves a handler.

A request is built as TorchServe 0.12's frontend builds it (see :mod:`handlerkit.worker.requests`):
URL query parameters become untyped parameters, then either the multipart / urlencoded form
fields or the raw body under ``"body"``; the request's headers, with the frontend's own
``url_path`` and ``explain`` replacing any the client sent. Responses are read back from the
context as the worker writes them: per-request status, phrase and headers (content type
included), ``bytes``/``str`` items as they are, anything else JSON (``indent=2``, as the worker).
A batch the worker failed is answered as the frontend answers it (:func:`worker_error`): an
``InternalServerException`` document for every request of the batch, whatever the code.

``GET /models/<model>[/<version>][?customized=true]`` answers as TorchServe's management API
does (:func:`description`): the model's settings, the worker that answered and, with
``customized=true``, what the handler's ``describe_handle`` returned, from a describe request
sent through the batch queue alone (``describe: "True"``, no parameters).

Differences from TorchServe a handler could notice: ASGI servers lower-case header names, so
``Content-Type`` arrives as ``content-type`` (TorchServe keeps the client's case); a describe
request also carries ``explain: "False"`` and ``url_path: ""``, as every handlerkit request does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from email import policy
from email.parser import BytesParser
from typing import Any, NamedTuple

from handlerkit.errors import PredictionException
from handlerkit.worker import _wire
from handlerkit.worker.context import read_responses
from handlerkit.worker.requests import Parameter, Request

__all__ = [
    "WORKER_DIED",
    "Reply",
    "Route",
    "customized_metadata",
    "description",
    "error_reply",
    "model_fields",
    "parse_route",
    "replies",
    "to_request",
    "worker_error",
    "worker_failure",
]

#: What TorchServe's frontend adds; a client's own values of these are replaced.
_FRONTEND_HEADERS = ("explain", "url_path")


class Route(NamedTuple):
    """Where a request goes: ``kind`` is ``"predict"``, ``"explain"``, ``"describe"``, ``"ping"``
    or ``"unknown"``."""

    kind: str
    model: str | None = None
    version: str | None = None
    url_path: str = ""


class Reply(NamedTuple):
    """One HTTP answer: status, reason phrase, headers and body; ``failed`` when the worker failed
    the request's batch (a stream already begun is then cut, :mod:`handlerkit.serving.frontend.streams`)."""

    status: int
    phrase: str | None
    headers: dict[str, str]
    body: bytes
    failed: bool = False


def parse_route(path: str) -> Route:
    """``/predictions/<model>[/<version>[/<more>]]``, ``/explanations/...``, ``/ping`` or
    ``/models/<model>[/<version>]`` (describe).

    Segments are split as Java's ``String.split("/")`` does (trailing empty ones dropped), so
    ``/predictions/m/1.0/v1/chat/`` gives ``url_path="v1/chat"``.
    """
    segments = path.strip("/").split("/") if path.strip("/") else []
    if segments == ["ping"]:
        return Route("ping")
    if len(segments) >= 2 and segments[0] in ("predictions", "explanations"):
        kind = "predict" if segments[0] == "predictions" else "explain"
        version = segments[2] if len(segments) > 2 else None
        return Route(kind, segments[1], version, "/".join(segments[3:]))
    if len(segments) in (2, 3) and segments[0] == "models":
        return Route("describe", segments[1], segments[2] if len(segments) == 3 else None)
    return Route("unknown")


def _form_fields(content_type: str, body: bytes) -> list[Parameter]:
    """Multipart fields as Netty's decoder gives them: plain fields untyped, uploads typed
    (``application/octet-stream`` when the part names no type)."""
    message = BytesParser(policy=policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    fields = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        raw_type = part.get("Content-Type")
        ctype = str(raw_type).split(";", 1)[0].strip() if raw_type is not None else None
        if ctype is None and part.get_filename() is not None:
            ctype = _wire.OCTET_STREAM
        payload = part.get_payload(decode=True)
        fields.append(Parameter(str(name), payload if isinstance(payload, bytes) else b"", ctype))
    return fields


def to_request(
    headers: Iterable[tuple[str, str]],
    body: bytes,
    *,
    query: Sequence[tuple[str, str]] = (),
    explain: bool = False,
    url_path: str = "",
    request_id: str | None = None,
) -> Request:
    """The :class:`~handlerkit.worker.requests.Request` TorchServe's frontend would forward for this HTTP
    request; ``request_id`` when given (the engine's own id for it), else a fresh one."""
    hdrs = {k: v for k, v in headers if k not in _FRONTEND_HEADERS}
    hdrs.update(explain="True" if explain else "False", url_path=url_path.rstrip("/"))
    content_type = next((v for k, v in hdrs.items() if k.lower() == "content-type"), None)
    if _wire.is_multipart(content_type):
        params: tuple[Parameter, ...] = tuple(_form_fields(content_type or "", body))
    elif _wire.is_urlencoded(_wire.media_type(content_type)):
        params = tuple(Parameter(*f) for f in _wire.urlencoded_fields(body))
    else:
        params = (Parameter("body", body, _wire.media_type(content_type)),)
    query_params = tuple(Parameter(k, v.encode("utf-8"), None) for k, v in query)
    if request_id:
        request = Request(query_params + params, hdrs, url_path=url_path, request_id=request_id)
    else:
        request = Request(query_params + params, hdrs, url_path=url_path)
    return dataclasses.replace(request)  # validated once more as a whole (cheap)


def _body(item: Any) -> bytes | None:
    """The worker's encoding of one output item; None when JSON cannot encode it."""
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    try:
        return json.dumps(item, indent=2).encode("utf-8")
    except (TypeError, ValueError):
        return None


def error_reply(code: int, message: str, kind: str | None = None) -> Reply:
    """TorchServe's error document ``{"code", "type", "message"}`` for an error of the frontend
    itself (a bad request, no such model, no worker free); :func:`worker_error` for a batch the
    worker failed."""
    kind = kind or (
        "BadRequestException"
        if code < 500
        else "ServiceUnavailableException"
        if code == 503
        else "InternalServerException"
    )
    # TorchServe ends every error document with a newline (read from the real server: 404, 503).
    body = json.dumps({"code": code, "type": kind, "message": message}, indent=2).encode("utf-8") + b"\n"
    return Reply(code, None, {"content-type": "application/json"}, body)


def worker_error(code: int, message: str) -> Reply:
    """What the frontend answers every request of a batch the worker failed: ``RestJob.sendError``
    sends an ``InternalServerException`` document whatever the code (503 "Prediction failed", a
    ``PredictionException``'s own code, 500 "Worker died."), and turns a 413 into a 507."""
    return error_reply(507 if code == 413 else code, message, "InternalServerException")._replace(failed=True)


def worker_failure(exc: BaseException) -> tuple[int, str]:
    """The code and message TorchServe's worker answers a whole batch with when ``handle``
    raised ``exc``: a ``PredictionException``'s own, 507 "Out of resources" for a ``MemoryError``
    (or a CUDA error), else 503 "Prediction failed"."""
    if isinstance(exc, PredictionException) or type(exc).__name__ == "PredictionException":
        return int(getattr(exc, "error_code", 500)), str(getattr(exc, "message", exc))
    if isinstance(exc, MemoryError) or "CUDA" in str(exc):
        return 507, "Out of resources"
    return 503, "Prediction failed"


#: A batch whose worker did not answer within ``responseTimeout``: TorchServe kills the worker
#: process, answers the batch this, and starts a new worker (``WorkerThread.run``).
WORKER_DIED = worker_error(500, "Worker died.")


def replies(output: Any, context: Any, n: int) -> list[Reply]:
    """One reply per request from what ``handle`` returned, read back as the worker does.

    A return that is not a list of ``n`` items fails the whole batch with 503, as TorchServe's
    ``Service.predict`` does.
    """
    if not isinstance(output, list):
        return [worker_error(503, "Invalid model predict output")] * n
    if len(output) != n:
        return [worker_error(503, "number of batch response mismatched")] * n
    infos = read_responses(context)
    out = []
    for i, item in enumerate(output):
        body = _body(item)
        if body is None:
            return [worker_error(503, "Unsupported model output data type.")] * n
        code, phrase, headers = infos[i] if i < len(infos) else (200, None, {})
        out.append(Reply(code or 200, phrase or None, {k: str(v) for k, v in _plain(headers).items()}, body))
    return out


def _plain(headers: Mapping[str, Any]) -> dict[str, Any]:
    # Empty content types are not sent (the worker encodes them as absent).
    return {k: v for k, v in headers.items() if not (k.lower() == "content-type" and not v)}


def model_fields(config: Any, *, name: str, version: str | None, url: str, gpu: bool) -> dict[str, Any]:
    """The settings TorchServe 0.12 lists for a model in ``GET /models/<m>``, in its order, with
    its defaults where ``config`` (a :class:`~handlerkit.worker.config.ModelConfig`) says nothing."""

    def get(attr: str, default: Any) -> Any:
        value = getattr(config, attr, None)
        return default if value is None else value

    return {
        "modelName": name,
        "modelVersion": version or "1.0",
        "modelUrl": url,
        "runtime": "python",
        "minWorkers": get("min_workers", 1),
        "maxWorkers": get("max_workers", get("min_workers", 1)),
        "batchSize": get("batch_size", 1),
        "maxBatchDelay": get("max_batch_delay", 100),
        "responseTimeout": get("response_timeout", 120),
        "startupTimeout": get("startup_timeout", 120),
        "maxRetryTimeoutInSec": get("max_retry_timeout_in_sec", 300),
        "clientTimeoutInMills": get("client_timeout_in_mills", 0),
        "parallelType": get("parallel_type", ""),
        "parallelLevel": get("parallel_level", 0),
        "deviceType": "gpu" if gpu else "cpu",
        "continuousBatching": get("continuous_batching", False),
        "useJobTicket": get("use_job_ticket", False),
        "useVenv": False,
        "stateful": get("sequence_batching", False),
        "sequenceMaxIdleMSec": get("sequence_max_idle_msec", 0),
        "sequenceTimeoutMSec": get("sequence_timeout_msec", 0),
        "maxNumSequence": get("max_num_sequence", 0),
        "maxSequenceJobQueueSize": get("max_sequence_job_queue_size", 0),
        "loadedAtStartup": True,
    }


def customized_metadata(body: bytes) -> Any:
    """What TorchServe's frontend makes of a describe answer: the JSON object it holds; ``{}``
    for anything else (it logs "Customized metadata should be a dictionary."); absent (None
    here) when the handler returned None or nothing."""
    text = body.decode("utf-8", "replace").strip()
    if not text or text == "null":
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def description(
    fields: Mapping[str, Any], *, worker: Mapping[str, Any], pending: int, capacity: int, customized: Any = None
) -> Reply:
    """TorchServe's describe answer: a JSON list of one model, ``customizedMetadata`` last when
    given (a Ray replica lists itself as the one worker)."""
    model = dict(fields)
    model["workers"] = [dict(worker)]
    model["jobQueueStatus"] = {"remainingCapacity": max(0, capacity - pending), "pendingRequests": pending}
    if customized is not None:
        model["customizedMetadata"] = customized
    return Reply(200, None, {"content-type": "application/json"}, json.dumps([model], indent=2).encode("utf-8"))
