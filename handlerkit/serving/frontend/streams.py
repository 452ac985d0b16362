"""A streaming handler's chunks, from the worker socket to each request's client, as TorchServe's
frontend sends them (engine-free: no Ray import).

What TorchServe 0.12 does (``RestJob.responseInference``, ``BatchAggregator.sendResponse``),
checked byte for byte against the real server (``tests/worker/test_streaming_server.py``):

- a request's first chunk opens its HTTP answer: the status line and headers are that chunk's
  (its content type, the handler's headers, ``ts_stream_next: true``), sent with
  ``transfer-encoding: chunked``; each later send is one HTTP chunk, its status and headers not
  sent;
- the final answer (``handle``'s return) is the last HTTP chunk, then the terminating empty
  one; its status and headers are not sent either, and an empty payload sends no chunk;
- a request of the batch that got no chunk is answered with one full response, as usual;
- a failure after the first chunk (``handle`` raised, a non-200 frame) cannot change what was
  sent: the frontend resets the connection, so the client sees the stream cut before its end.

:class:`StreamRouter` is the frontend's end of the worker socket: a handler's
``send_intermediate_predict_response`` writes frames to it (``context.cl_socket``) from any
thread; it decodes each and hands every part to the request it names, on the serving loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from handlerkit.serving._http import Reply, worker_error
from handlerkit.worker.streaming import FrameError, decode_frame

__all__ = ["Opened", "StreamBroken", "StreamRouter"]

logger = logging.getLogger("handlerkit.serving")


class StreamBroken(RuntimeError):
    """A stream failed after its first chunk: the connection is cut, as TorchServe's frontend cuts it."""


class _Part(NamedTuple):
    """One request's part of a frame: its status, headers (content type included) and payload."""

    status: int
    headers: dict[str, str]
    body: bytes
    frame_code: int
    frame_message: str


class _Final(NamedTuple):
    reply: Reply


class Opened(NamedTuple):
    """How a request's answer begins: ``reply`` alone (no chunk came first), or a stream's
    ``status``, ``headers`` and ``body`` (bytes for each HTTP chunk, raising StreamBroken when
    the stream fails part-way)."""

    reply: Reply | None
    status: int = 200
    headers: dict[str, str] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)
    body: AsyncIterator[bytes] | None = None


class StreamRouter:
    """Stands in for the worker socket on a serving replica: ``sendall(frame)`` from the handler's
    thread; each part goes to the request it names (:meth:`open`), in send order, on ``loop``.
    Parts for a request nobody waits for are dropped (TorchServe fails the batch there; the
    Harness's contract checks name such a handler's fault)."""

    def __init__(self) -> None:
        self._channels: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._lock = threading.Lock()
        self.dropped = 0  # parts no request waited for

    def sendall(self, data: bytes | bytearray) -> None:
        try:
            code, message, parts = decode_frame(bytes(data))
        except FrameError as exc:
            logger.error("handlerkit: a send to context.cl_socket is no predict-response frame (%s): dropped", exc)
            return
        for request_id, content_type, status, _phrase, headers, body in parts:
            with self._lock:
                channel = self._channels.get(request_id)
            if channel is None:
                self.dropped += 1
                continue
            out = dict(headers)
            if content_type:
                out["content-type"] = content_type
            loop, queue = channel
            loop.call_soon_threadsafe(queue.put_nowait, _Part(status, out, body, code, message))

    def send(self, request_id: str, reply: Reply) -> None:
        """One HTTP chunk for ``request_id``, on the serving loop: a continuous-batching step's
        answer that leaves the request unfinished (``ts_stream_next: true``)."""
        with self._lock:
            channel = self._channels.get(request_id)
        if channel is None:
            self.dropped += 1
            return
        headers = {k.lower() if k.lower() == "content-type" else k: v for k, v in reply.headers.items()}
        channel[1].put_nowait(_Part(reply.status, headers, reply.body, 200, "OK"))

    def open(self, request_id: str) -> asyncio.Queue[Any]:
        """Start taking ``request_id``'s parts (call on the serving loop, before its batch runs)."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            self._channels[request_id] = (asyncio.get_running_loop(), queue)
        return queue

    def close(self, request_id: str) -> None:
        with self._lock:
            self._channels.pop(request_id, None)

    async def answer(self, request_id: str, queue: asyncio.Queue[Any], reply: asyncio.Future[Reply]) -> Opened:
        """How ``request_id``'s answer begins: its first chunk, or ``reply`` (the batch's answer
        for it) when that comes first. The router stops taking its parts once it ends."""
        reply.add_done_callback(lambda done: queue.put_nowait(_Final(_result(done))))
        try:
            first = await queue.get()
        except BaseException:  # the client went away: its batch may still run, unread
            self.close(request_id)
            raise
        if isinstance(first, _Final):
            self.close(request_id)
            return Opened(first.reply)
        if first.frame_code != 200:  # an error frame before any chunk: the frontend's error answer
            self.close(request_id)
            return Opened(_frame_error(first))
        return Opened(None, first.status, first.headers, self._body(request_id, queue, first))

    async def _body(self, request_id: str, queue: asyncio.Queue[Any], first: _Part) -> AsyncIterator[bytes]:
        try:
            event: Any = first
            while True:
                if isinstance(event, _Final):
                    if event.reply.failed:
                        raise StreamBroken(
                            f"request {request_id} failed after its stream began ({event.reply.status}: "
                            f"{event.reply.body.decode('utf-8', 'replace')}); its connection is cut, as TorchServe's"
                        )
                    if event.reply.body:
                        yield event.reply.body
                    return
                if event.frame_code != 200:
                    raise StreamBroken(
                        f"request {request_id} got a {event.frame_code} frame ({event.frame_message}) after its "
                        "stream began; its connection is cut, as TorchServe's"
                    )
                if event.body:
                    yield event.body
                event = await queue.get()
        finally:
            self.close(request_id)


def _result(done: asyncio.Future[Reply]) -> Reply:
    if done.cancelled() or done.exception() is not None:  # the replica answers its own failures as replies
        return worker_error(503, "Prediction failed")
    return done.result()


def _frame_error(part: _Part) -> Reply:
    return worker_error(part.frame_code, part.frame_message)
