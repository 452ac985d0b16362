"""A replica's failures, told as a notebook tells them (imports Ray only inside the functions
that talk to it).

TorchServe's worker writes every failed batch to its model log, kills a worker that runs past
``responseTimeout``, and a model whose worker cannot load does not start. A Ray Serve replica on
its own answers a bare 503 and logs nothing (the ``handlerkit`` logger has only its
``NullHandler``), and a constructor that raises is restarted while its traceback scrolls by as
text. Here:

- :data:`logger` (``handlerkit.serving``) writes, in a replica, through Serve's replica logger
  (:func:`log_through_serve`): to the replica's log file
  (``logs/serve/replica_<app>_<deployment>_<id>.log``) and to its stderr, which Ray forwards to
  the driver's console; once each.
- :func:`batch_failure` is the :class:`~handlerkit.errors.StageError` of a failed batch, built
  only when one fails: the stage read off the traceback, the request at fault, ``file:line``
  and the fix (:mod:`handlerkit.recording.failures`, as the Harness builds it).
- :func:`timeout_failure` is the StageError of a batch still running at ``responseTimeout``:
  where the handler's thread is at that moment (its stack, read as a traceback).
- :func:`publish_load_failure` and :func:`take_load_failure` hand the error of a handler that
  could not load from the replica to the driver through Ray's key-value store (in the GCS, so
  on a cluster too), as data, never as text parsed back: the driver raises the error the
  notebook shows.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import TYPE_CHECKING, Any

from handlerkit import errors
from handlerkit.errors import HandlerkitError, StageError
from handlerkit.recording import failures

if TYPE_CHECKING:
    from handlerkit.service import Service
    from handlerkit.worker.batches import Batch

__all__ = [
    "batch_failure",
    "forget_load_failure",
    "load_failure",
    "log_through_serve",
    "logger",
    "publish_load_failure",
    "take_load_failure",
    "timeout_failure",
]

#: The replicas' logger: failed batches, timed-out batches, handlers that fail to load.
logger = logging.getLogger("handlerkit.serving")

_SERVE_LOGGER = "ray.serve"  # Serve's replica logger: its file handler and its stderr handler
_KV_NAMESPACE = "handlerkit"


class _ServeLog(logging.Handler):
    """Hands each record to Serve's replica logger, whose handlers write the replica's log file
    and its stderr (with the replica's name and id in each line)."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(_SERVE_LOGGER).handle(record)


def log_through_serve() -> None:
    """In a replica: :data:`logger` writes where Serve's own replica logs go, and only there (a
    handler module's ``logging.basicConfig()`` must not print each failure a second time)."""
    if not any(isinstance(h, _ServeLog) for h in logger.handlers):
        logger.addHandler(_ServeLog())
    logger.propagate = False


# -- the StageError of a batch ---------------------------------------------------------------


#: What a server's fix says to do once the raising line is corrected.
SERVE_AGAIN = "serve the model again (handlerkit serve)"


def batch_failure(service: Service, batch: Batch, exc: BaseException, files: frozenset[str]) -> StageError:
    """The StageError for ``exc``, raised by ``service.handle(batch)``: the stage method the
    traceback passed through (``handle`` for a function or an overridden ``handle``), the
    request at fault when it can be told (each request is run again alone, from preprocess up
    to that stage when it got its input from the batch's own data, else through a handle of the
    handler's own; what it streams then reaches no client), where in the user's files it was
    raised, and the fix."""
    handler = service.handler
    stage = failures.stage_of(exc, handler) if handler is not None else "handle"
    # BaseHandler.handle passes the batch's data list to preprocess as it is, and each stage's
    # output to the next; an envelope or a handle of the handler's own may not.
    on_batch_data = service.envelope is None and not service.single_stage
    return failures.batch_error(
        stage,
        exc,
        handler=handler,
        handler_name=service.name,
        batch=batch,
        context=service.context,
        imports=service.running,
        handler_files=files,
        on_batch_data=on_batch_data,
        then=SERVE_AGAIN,
        enveloped=service.envelope is not None,
        service=service,
    )


class ResponseTimeout(TimeoutError):
    """A batch still running at ``responseTimeout``; its traceback is where the handler was."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def timeout_failure(service: Service, thread_id: int | None, timeout_s: float, files: frozenset[str]) -> StageError:
    """The StageError of a batch the handler's thread (``thread_id``) is still running after
    ``timeout_s``: the stage and the line it is at, read off the thread's current stack."""
    exc = ResponseTimeout(
        f"no answer within responseTimeout ({timeout_s:g} s); the handler was still running",
        fix="make the handler answer sooner, or raise responseTimeout in model-config.yaml",
    )
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None  # for debuggers: documented
    tb = None
    while frame is not None:  # innermost first: the traceback reads outermost → innermost
        tb = types.TracebackType(tb, frame, frame.f_lasti, frame.f_lineno)
        frame = frame.f_back
    exc.__traceback__ = tb
    handler = service.handler
    stage = failures.stage_of(exc, handler) if handler is not None else "handle"
    return failures.stage_error(
        stage, exc, handler=service.name, request_index=None, handler_files=files, then=SERVE_AGAIN
    )


# -- a handler that fails to load ------------------------------------------------------------


def load_failure(exc: BaseException, service: Service | None) -> HandlerkitError:
    """The error of a model that could not load: handlerkit's own (a handler spec that cannot
    be resolved, a bad manifest …) as it is; what ``initialize`` (or a function handler's
    ``handle(None, context)``) raised as a StageError of stage ``initialize``."""
    if isinstance(exc, HandlerkitError):
        return exc
    if service is None:
        return HandlerkitError(f"the model could not be opened: {type(exc).__name__}: {exc}")
    files = failures.handler_files(service.function or service.handler)
    return failures.stage_error(
        "initialize", exc, handler=service.name, request_index=None, handler_files=files, then=SERVE_AGAIN
    )


def _record(error: HandlerkitError) -> dict[str, Any]:
    """An error as JSON data: its class name, message, fix, and a StageError's fields."""
    record: dict[str, Any] = {"type": type(error).__name__, "message": error.message, "fix": error.fix}
    if isinstance(error, StageError):
        record.update(
            stage=error.stage,
            handler=error.handler,
            request_index=error.request_index,
            location=list(error.location) if error.location else None,
            locations=[list(at) for at in error.locations],
        )
    return record


def _rebuild(record: dict[str, Any]) -> HandlerkitError:
    """The error :func:`_record` describes (a StageError, or the handlerkit error of that name)."""
    message, fix = str(record.get("message", "")), record.get("fix")
    if "stage" in record:
        location = record.get("location")
        return StageError(
            message,
            stage=str(record["stage"]),
            handler=str(record.get("handler") or ""),
            request_index=record.get("request_index"),
            fix=fix,
            location=(str(location[0]), int(location[1]), str(location[2])) if location else None,
            locations=[(str(at[0]), int(at[1]), str(at[2])) for at in record.get("locations") or ()],
        )
    cls = getattr(errors, str(record.get("type")), None)
    if isinstance(cls, type) and issubclass(cls, HandlerkitError):
        try:
            return cls(message, fix=fix)
        except TypeError:  # a class with other required arguments
            pass
    return HandlerkitError(message, fix=fix)


def _key(app_name: str) -> str:
    return f"load-failure/{app_name}"


def publish_load_failure(error: HandlerkitError) -> None:
    """In a replica: leave ``error`` for the driver deploying its application (best effort: the
    deployment fails either way, with Ray's text)."""
    try:
        from ray import serve
        from ray.experimental import internal_kv  # Serve keeps its own state there too

        app = serve.get_replica_context().app_name
        internal_kv._internal_kv_put(_key(app), json.dumps(_record(error)), overwrite=True, namespace=_KV_NAMESPACE)
    except Exception as exc:  # never hide the load failure behind a failure to report it
        logger.warning("could not hand the load failure to the driver: %s: %s", type(exc).__name__, exc)


def forget_load_failure(app_name: str) -> None:
    """In the driver, before deploying: drop what an earlier deployment of ``app_name`` left."""
    try:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(_key(app_name), namespace=_KV_NAMESPACE)
    except Exception:  # nothing to forget, or no key-value store: take_load_failure finds nothing
        pass


def take_load_failure(app_name: str) -> HandlerkitError | None:
    """In the driver, once deploying ``app_name`` failed: the error a replica left, or None."""
    try:
        from ray.experimental import internal_kv

        raw = internal_kv._internal_kv_get(_key(app_name), namespace=_KV_NAMESPACE)
        if raw is None:
            return None
        internal_kv._internal_kv_del(_key(app_name), namespace=_KV_NAMESPACE)
        return _rebuild(json.loads(raw))
    except Exception:  # unreadable: the caller raises Ray's own error
        return None
