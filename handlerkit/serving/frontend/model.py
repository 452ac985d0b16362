"""One model's frontend: what TorchServe's Java frontend does for a model (its ``Model`` and
``WorkerThread``), in front of one :class:`~handlerkit.service.Service` (engine-free).

An engine's transport (the Ray replica, the KServe model) turns HTTP into a
:class:`~handlerkit.worker.requests.Request` (:func:`~handlerkit.serving._http.to_request`) and a
:class:`~handlerkit.serving.frontend.dispatch.Job`, hands them to :meth:`Frontend.answer` (or
:meth:`Frontend.reply` where it cannot stream) and sends back what comes. The frontend does the
rest, once for every engine: batches (:mod:`~handlerkit.serving.frontend.dispatch`), the one
handle thread, its ``responseTimeout`` and failure answers and logs
(:mod:`~handlerkit.serving.frontend.handle_thread`), sequences
(:meth:`Frontend.admit`), continuous batching, and streams (a chunk a handler sends through
``send_intermediate_predict_response`` goes to its request's client as it comes:
:class:`~handlerkit.serving.frontend.streams.StreamRouter`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from handlerkit.serving._http import Reply, customized_metadata
from handlerkit.serving.frontend.continuous import ContinuousLoop
from handlerkit.serving.frontend.dispatch import (
    AsyncDispatch,
    BatchDispatch,
    ContinuousDispatch,
    Dispatch,
    Job,
    SequenceDispatch,
)
from handlerkit.serving.frontend.handle_thread import HandleThread
from handlerkit.serving.frontend.sequence_desk import Admitted, SequenceDesk
from handlerkit.serving.frontend.streams import Opened, StreamRouter
from handlerkit.worker.config import parse_config
from handlerkit.worker.requests import Request

if TYPE_CHECKING:
    from handlerkit.service import Service

__all__ = ["Frontend", "Settings", "settings"]

#: TorchServe's defaults where model-config.yaml says nothing.
DEFAULT_MAX_BATCH_DELAY_MS = 100
DEFAULT_RESPONSE_TIMEOUT_S = 120.0


class Settings(NamedTuple):
    """The frontend's settings from ``model-config.yaml``: ``batchSize``, ``maxBatchDelay`` (s
    here) and ``responseTimeout`` (s)."""

    batch_size: int = 1
    max_batch_delay_s: float = DEFAULT_MAX_BATCH_DELAY_MS / 1000.0
    response_timeout_s: float = DEFAULT_RESPONSE_TIMEOUT_S


def settings(config: Any) -> Settings:
    """The :class:`Settings` a model config asks for (a :class:`~handlerkit.worker.config.ModelConfig`
    or the raw mapping), TorchServe's defaults where it says nothing."""
    cfg = config if hasattr(config, "batch_size") else parse_config(config or {})
    delay_ms = cfg.max_batch_delay if cfg.max_batch_delay is not None else DEFAULT_MAX_BATCH_DELAY_MS
    return Settings(
        batch_size=max(1, cfg.batch_size or 1),
        max_batch_delay_s=delay_ms / 1000.0,
        response_timeout_s=float(cfg.response_timeout or DEFAULT_RESPONSE_TIMEOUT_S),
    )


#: A prediction through the handler's own entry point, in no sequence.
PREDICT = Job()
_DEFAULTS = Settings()


class Frontend:
    """TorchServe's frontend for one initialized :class:`~handlerkit.service.Service`.

    Args:
        service: the model, ``initialize`` already run.
        name: the model name (URLs, the log, the 503 of a full sequence desk).
        settings: batching and timeout (:func:`settings` reads them from the model config).
        envelopes: service envelopes a :class:`Job` may name (the KServe protocols').
        base: builds the batching strategy from the handle thread, in place of TorchServe's
            (:class:`BatchDispatch`; :class:`AsyncDispatch` for an async handler): an engine's own.
    """

    def __init__(
        self,
        service: Service,
        *,
        name: str,
        settings: Settings = _DEFAULTS,
        envelopes: Sequence[str] = (),
        base: Callable[[HandleThread], Dispatch] | None = None,
    ) -> None:
        self.service, self.name, self.settings = service, name, settings
        self.context = service.context
        # The worker socket's frontend end: a streaming handler's chunks go to their requests' clients.
        self.router = StreamRouter()
        self.context.cl_socket = self.router
        self.thread = HandleThread(service, name=name, timeout_s=settings.response_timeout_s, envelopes=envelopes)
        config = getattr(self.context, "model_yaml_config", None) or {}
        #: The sequences held (``sequenceBatching: true``), else None.
        self.desk = SequenceDesk.from_config(name, config)
        self.loop: ContinuousLoop | None = None
        self.dispatch = self._compose(base, continuous=bool(config.get("continuousBatching")))

    def _compose(self, base: Callable[[HandleThread], Dispatch] | None, *, continuous: bool) -> Dispatch:
        """The strategies the config asks for, each wrapping the one below (see dispatch)."""
        if base is not None:
            dispatch = base(self.thread)
        elif self.service.asynchronous:
            dispatch = AsyncDispatch(self.thread)
        else:
            dispatch = BatchDispatch(
                self.thread, batch_size=self.settings.batch_size, max_delay_s=self.settings.max_batch_delay_s
            )
        if self.desk is None:
            return dispatch
        dispatch = SequenceDispatch(dispatch, self.desk)
        if continuous:
            self.loop = ContinuousLoop(
                self.thread.gather, self.router.send, self.desk.answered, batch_size=self.settings.batch_size
            )
            dispatch = ContinuousDispatch(dispatch, self.loop)
        return dispatch

    # -- requests --------------------------------------------------------------------------
    def admit(self, headers: Iterable[tuple[str, str]]) -> Admitted | Reply | None:
        """A prediction's sequence, as TorchServe's frontend admits it (the headers it adds), or
        its error reply; None for a model that keeps no sequences."""
        return self.desk.admit(headers) if self.desk is not None else None

    async def reply(self, request: Request, job: Job = PREDICT) -> Reply:
        """``request``'s whole answer (what it streamed, if anything, is not sent: use :meth:`answer`)."""
        return await self.dispatch.submit(request, job)

    async def answer(self, request: Request, job: Job = PREDICT) -> Opened:
        """How ``request``'s answer begins: its first streamed chunk (then the rest of its stream),
        or its whole reply when that comes first."""
        queue = self.router.open(request.request_id)  # before its batch can run: no chunk is missed
        answer = asyncio.ensure_future(self.reply(request, job))
        try:
            return await self.router.answer(request.request_id, queue, answer)
        except asyncio.CancelledError:  # the client went away: drop its request, as a cancelled await did
            answer.cancel()
            raise

    async def customized(self, headers: Mapping[str, str]) -> Reply | Any:
        """What the handler's ``describe_handle`` says (TorchServe's ``customizedMetadata``),
        asked through the queue as a describe request alone; its failed reply when it fails."""
        request = Request((), {**dict(headers), "describe": "True"})
        reply = await self.dispatch.submit(request, Job("describe"))
        return reply if reply.status >= 400 else customized_metadata(reply.body)

    # -- state -----------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Requests waiting for a batch."""
        return self.dispatch.pending

    @property
    def stuck(self) -> str | None:
        """Why no batch runs any more (one ran past ``responseTimeout``): the engine should
        replace this model's server; None while healthy."""
        return self.thread.stuck

    def stats(self) -> dict[str, Any]:
        """The batch sizes run, each ``handle``'s milliseconds and each continuous-batching
        step's request ids (for tests and benchmarks)."""
        return {
            "batch_sizes": list(self.thread.batch_sizes),
            "handle_ms": list(self.thread.handle_ms),
            "steps": [list(step) for step in self.loop.steps] if self.loop is not None else [],
        }

    def close(self) -> None:
        self.thread.close()
