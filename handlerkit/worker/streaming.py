"""Streaming handlers: what ``handle`` sends before it returns, read as TorchServe's frontend reads it.

A streaming handler calls ``send_intermediate_predict_response(ret, req_id_map, message, code,
context)``: TorchServe's (``ts/handler_utils/utils.py``) or handlerkit's own
(:func:`send_intermediate_predict_response`, the same bytes, no ``ts`` needed). It encodes a
predict-response frame (``create_predict_response``, each request's part marked
``ts_stream_next: true``) and writes it to ``context.cl_socket``. The frontend sends each
request's part to that request's client as an HTTP chunk; ``handle``'s return, the final
answer, ends the stream (``ts_stream_next: false``). Here:

- :func:`send_intermediate_predict_response` and :func:`encode_frame`, the worker's side, and
  :func:`decode_frame`, the frontend's;
- :class:`ChunkSocket`, the worker socket's stand-in on a :class:`~handlerkit.MockContext`: it
  keeps each frame sent and when;
- :class:`Chunk`, one request's part of a frame, decoded as the frontend decodes it;
- :class:`RequestStream`, one request's chunks with its time to first chunk and inter-chunk
  p50/p99;
- :func:`collect`, a run's chunks, streams and contract problems
  (:func:`handlerkit.worker.contract.check_chunks`), which the Harness keeps in its
  :class:`~handlerkit.recording.results.Run`;
- :func:`streamed`, the chunks yielded as they are sent while a run goes on in a worker thread
  (``Harness.stream``).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import queue
import struct
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from handlerkit.errors import HandlerkitError
from handlerkit.worker.contract import _UNENCODABLE, Problem, check_chunks
from handlerkit.worker.timer import percentile

__all__ = [
    "Chunk",
    "ChunkSocket",
    "RequestStream",
    "Streamed",
    "collect",
    "decode_frame",
    "encode_frame",
    "send_intermediate_predict_response",
    "streamed",
]

R = TypeVar("R")

_INT = struct.Struct("!i")
#: One request's part of a frame: request id, content type, status, reason phrase, headers, payload.
_Part = tuple[str, str, int, str, Mapping[str, str], bytes]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One request's part of a frame the handler sent, as the frontend reads it.

    Attributes:
        request_id: the request id the frame names.
        index: that request's index in the batch; None when no request of the batch has the id.
        body: the payload bytes (``str`` sent as UTF-8, other values as the worker encodes them:
            JSON with ``indent=2``, a tensor as ``torch.save`` bytes).
        code / phrase: the request's HTTP status and reason phrase.
        content_type: its ``content-type`` (empty when none was set).
        headers: its response headers (``ts_stream_next: "true"`` on an intermediate chunk).
        time_ms: when it was sent, in ms since ``handle`` was called.
        frame: which send of the run carried it (0 for the first).
        frame_code / frame_message: the frame's own code and message (a 503 frame ends every
            request of the batch with an error).
    """

    request_id: str
    index: int | None
    body: bytes
    code: int
    phrase: str
    content_type: str
    headers: dict[str, str]
    time_ms: float
    frame: int
    frame_code: int = 200
    frame_message: str = ""

    @property
    def text(self) -> str:
        """The payload as text (UTF-8; undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self) -> str:
        who = f"request {self.index}" if self.index is not None else f"unknown request {self.request_id!r}"
        body = self.body if len(self.body) <= 40 else self.body[:37] + b"..."
        status = "" if self.code == 200 else f" {self.code}"
        return f"<Chunk {who} at {self.time_ms:.2f} ms{status}: {body!r}>"


# --- the worker's side: sending a chunk ---------------------------------------------------------


def send_intermediate_predict_response(ret: Any, req_id_map: Any, message: str, code: int, context: Any) -> None:
    """Send one chunk to each request of ``req_id_map`` before ``handle`` returns: TorchServe
    0.12's function of the same name (``ts.handler_utils.utils``), its signature and its bytes,
    without TorchServe installed.

    Args:
        ret: the payloads, indexed by batch index (``ret[idx]``; a list, or a dict such as
            ``{idx: value}``); ``str`` is sent as UTF-8, ``bytes`` as they are, a tensor as
            ``torch.save`` bytes, anything else as JSON (``indent=2``). None sends ``error``.
        req_id_map: ``{batch index: request id}`` of the requests to send to
            (``context.request_ids`` for all of them).
        message: the frame's message; code: the frame's code (200; any other ends every request
            of the batch with that error at the frontend).
        context: the handler's context; its ``cl_socket`` receives the frame.

    As the worker does: each request's response header ``ts_stream_next`` is set to ``"true"``
    (its status, content type and headers go with the chunk); a payload that has no encoding
    sends a 503 ``"Unsupported model output data type."`` frame instead; a worker whose
    ``LOCAL_RANK`` is not 0 sends nothing. Works wherever ``context.cl_socket`` has
    ``sendall``: ``hk.MockContext`` (its :class:`ChunkSocket`), ``handlerkit serve``, and the
    real TorchServe worker. One difference, on purpose: TorchServe 0.12 writes the length of
    a content type or reason phrase in characters, so a non-ASCII one makes a frame its own
    frontend cannot read; here every length is in bytes, as the frontend reads them.
    """
    if str(os.getenv("LOCAL_RANK", 0)) != "0":  # one rank of a distributed model answers
        return None
    parts: list[_Part] = []
    for idx in req_id_map:  # in the worker's order: the mark, then the part, then the payload
        context.set_response_header(idx, "ts_stream_next", "true")
        status, phrase = context.get_response_status(idx)
        content_type = context.get_response_content_type(idx) or ""
        headers = dict(context.get_response_headers(idx))
        try:
            body = b"error" if ret is None else _payload(ret[idx])
        except TypeError:
            failed: list[_Part] = [(req_id_map.get(i), "", 503, "", {}, b"error") for i in req_id_map]
            context.cl_socket.sendall(encode_frame(503, _UNENCODABLE, failed))
            return None
        parts.append(
            (req_id_map.get(idx), content_type, 200 if status is None else status, phrase or "", headers, body)
        )
    context.cl_socket.sendall(encode_frame(code, message, parts))
    return None


def _payload(value: Any) -> bytes:
    """A payload as ``create_predict_response`` encodes it (TypeError: it has no encoding)."""
    if isinstance(value, (bytes, bytearray)):  # before str, as the worker checks them
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    torch = sys.modules.get("torch")  # a tensor means torch is imported already
    if torch is not None and isinstance(value, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue()
    return json.dumps(value, indent=2).encode("utf-8")


def encode_frame(
    code: int, message: str, parts: Iterable[tuple[str, str, int, str, Mapping[str, str], bytes]]
) -> bytes:
    """A predict-response frame as the worker's ``create_predict_response`` writes it; the
    inverse of :func:`decode_frame`, ``parts`` as it returns them: ``(request_id, content_type,
    code, phrase, headers, body)``. Every field is a 4-byte big-endian length (or number) and
    UTF-8 bytes; -1 ends the list."""
    out = bytearray(_INT.pack(code))
    _put(out, message.encode("utf-8"))
    for request_id, content_type, status, phrase, headers, body in parts:
        _put(out, request_id.encode("utf-8"))
        _put(out, content_type.encode("utf-8"))
        out += _INT.pack(status)
        _put(out, phrase.encode("utf-8"))
        out += _INT.pack(len(headers))
        for key, value in headers.items():
            _put(out, key.encode("utf-8"))
            _put(out, value.encode("utf-8"))
        _put(out, body)
    out += _INT.pack(-1)
    return bytes(out)


def _put(out: bytearray, data: bytes) -> None:
    out += _INT.pack(len(data))
    out += data


# --- the frontend's side: reading the chunks ------------------------------------------------------


class FrameError(ValueError):
    """Bytes on the socket that are no predict-response frame."""


def decode_frame(data: bytes) -> tuple[int, str, list[tuple[str, str, int, str, dict[str, str], bytes]]]:
    """A predict-response frame (``create_predict_response``) as the frontend reads it.

    Returns ``(code, message, parts)``, a part being ``(request_id, content_type, code, phrase,
    headers, body)``. Raises :class:`FrameError` on bytes of any other shape.
    """
    pos = 0

    def integer() -> int:
        nonlocal pos
        if pos + 4 > len(data):
            raise FrameError(f"the frame ends at byte {len(data)}, inside a length field")
        (value,) = _INT.unpack_from(data, pos)
        pos += 4
        return value

    def blob(size: int | None = None) -> bytes:
        nonlocal pos
        size = integer() if size is None else size
        if size < 0 or pos + size > len(data):
            raise FrameError(f"a field of {size} bytes at byte {pos} does not fit in the frame's {len(data)}")
        pos += size
        return data[pos - size : pos]

    try:
        code = integer()
        message = blob().decode("utf-8")
        parts = []
        while (size := integer()) != -1:
            request_id = blob(size).decode("utf-8")
            content_type = blob().decode("utf-8")
            status = integer()
            phrase = blob().decode("utf-8")
            headers = {blob().decode("utf-8"): blob().decode("utf-8") for _ in range(integer())}
            parts.append((request_id, content_type, status, phrase, headers, blob()))
    except UnicodeDecodeError as exc:
        raise FrameError(f"a text field is not UTF-8 ({exc})") from exc
    if pos != len(data):
        raise FrameError(f"{len(data) - pos} bytes follow the frame's end")
    return code, message, parts


class ChunkSocket:
    """Stands in for the worker socket: keeps each frame a handler sends (``sent``) and when
    (``times_ns``, ``time.perf_counter_ns``). ``listener``, when set, is called with each new
    frame's position in ``sent`` (from the thread that sent it)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.times_ns: list[int] = []
        #: Where the run's clock starts (``handle``'s call): chunk times are counted from it.
        self.origin_ns = 0
        self.listener: Callable[[int], Any] | None = None

    def sendall(self, data: bytes | bytearray) -> None:
        self.times_ns.append(time.perf_counter_ns())
        self.sent.append(bytes(data))
        listener = self.listener
        if listener is not None:
            listener(len(self.sent) - 1)

    @staticmethod
    def begin_run(context: Any, origin_ns: int) -> ChunkSocket | None:
        """``context``'s socket, begun (:meth:`begin`) for a run whose ``handle`` is called at
        ``origin_ns``; None when the context has no ChunkSocket (its sends are not read)."""
        socket = getattr(context, "cl_socket", None)
        if not isinstance(socket, ChunkSocket):
            return None
        socket.begin(origin_ns)
        return socket

    def begin(self, origin_ns: int) -> None:
        """A new run: forget the frames of the last one, count times from ``origin_ns``."""
        if self.sent:
            self.sent.clear()
            self.times_ns.clear()
        self.origin_ns = origin_ns

    def chunks(self, position: int, request_ids: Mapping[int, str] | None) -> list[Chunk]:
        """The chunks of frame ``position`` (:class:`FrameError` when it is no frame)."""
        code, message, parts = decode_frame(self.sent[position])
        index_of = {rid: idx for idx, rid in (request_ids or {}).items()}
        time_ms = (self.times_ns[position] - self.origin_ns) / 1e6
        return [
            Chunk(rid, index_of.get(rid), body, status, phrase, ctype, headers, time_ms, position, code, message)
            for rid, ctype, status, phrase, headers, body in parts
        ]

    def __repr__(self) -> str:
        return f"<intermediate responses: {len(self.sent)} sent>"


@dataclass(slots=True)
class RequestStream:
    """One request's stream: its chunks, then its final answer (``handle``'s return).

    ``gaps_ms`` are the intervals between its successive chunks, the final answer counted as the
    last one (its client receives it as the stream's last HTTP chunk); none without a final answer.
    """

    index: int
    request_id: str
    chunks: list[Chunk] = field(default_factory=list)
    final_ms: float | None = None  # when handle returned; None when the request got no final answer

    @property
    def first_chunk_ms(self) -> float:
        """Time to first chunk: from ``handle``'s call to the request's first chunk."""
        return self.chunks[0].time_ms

    @property
    def gaps_ms(self) -> list[float]:
        times = [c.time_ms for c in self.chunks]
        if self.final_ms is not None:
            times.append(self.final_ms)
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def inter_chunk_p50_ms(self) -> float | None:
        gaps = sorted(self.gaps_ms)
        return percentile(gaps, 50) if gaps else None

    @property
    def inter_chunk_p99_ms(self) -> float | None:
        gaps = sorted(self.gaps_ms)
        return percentile(gaps, 99) if gaps else None


@dataclass(slots=True)
class Streamed:
    """What a run sent before ``handle`` returned: every chunk in send order, one
    :class:`RequestStream` per request of the batch that got one, and the contract problems."""

    chunks: list[Chunk]
    streams: list[RequestStream]
    problems: list[Problem]


def collect(
    socket: ChunkSocket, context: Any, handle_ms: float, output: Any, output_problems: Sequence[Problem]
) -> Streamed:
    """The run's chunks (every frame in ``socket.sent``), per request of ``context``'s batch, and
    what breaks the worker's rules (``output_problems``: those
    :func:`~handlerkit.worker.contract.check_output` found in the final answer ``output``, which decide
    whether the streams end well).

    When they do, the final answer's ``ts_stream_next`` marks are set as the worker sets them
    (:func:`final_stream_next`)."""
    request_ids = context.request_ids or {}
    chunks: list[Chunk] = []
    malformed: list[tuple[int, str]] = []
    for position in range(len(socket.sent)):
        try:
            chunks.extend(socket.chunks(position, request_ids))
        except FrameError as exc:
            malformed.append((position, str(exc)))
    problems = check_chunks(chunks, malformed, request_ids, output_problems)
    finished = not any(p.check in ("stream-unfinished", "chunk-status", "chunk-type") for p in problems)
    by_index: dict[int, RequestStream] = {}
    for chunk in chunks:
        if chunk.index is not None and chunk.frame_code == 200:
            stream = by_index.get(chunk.index)
            if stream is None:
                stream = by_index[chunk.index] = RequestStream(chunk.index, chunk.request_id)
                stream.final_ms = handle_ms if finished else None
            stream.chunks.append(chunk)
    if finished:
        final_stream_next(context, output)
    return Streamed(chunks, [by_index[i] for i in sorted(by_index)], problems)


def final_stream_next(context: Any, output: Sequence[Any]) -> list[str | None]:
    """Each answer's ``ts_stream_next`` as the worker's ``create_predict_response`` sets it on the
    final answer, and set so on ``context``: from ``context.stopping_criteria[idx](answer)`` when
    the handler gave criteria (``None`` from one leaves the mark as it is), else a ``"true"`` the
    handler left becomes ``"false"``. Call it once per answer: the criteria are the handler's code."""
    criteria = getattr(context, "stopping_criteria", None)
    marks: list[str | None] = []
    for idx, answer in enumerate(output):
        if criteria:
            is_stop = criteria[idx](answer)
            if is_stop is not None:
                context.set_response_header(idx, "ts_stream_next", "false" if is_stop else "true")
        elif context.get_response_headers(idx).get("ts_stream_next") == "true":
            context.set_response_header(idx, "ts_stream_next", "false")
        marks.append(context.get_response_headers(idx).get("ts_stream_next"))
    return marks


def streamed(run: Callable[[], R], context: Any) -> Generator[Chunk, None, R]:
    """Call ``run()`` in a worker thread and yield each chunk as ``context.cl_socket`` (a
    :class:`ChunkSocket`) receives it; the generator's return value is ``run()``'s, and what
    ``run()`` raises comes out of the generator.

    A generator closed early (``break``) waits for ``run()`` to finish: a thread cannot be
    stopped, and the next run must not overlap this one. Frames that are no frame are skipped
    here (``run()``'s own checks report them). A context without a ChunkSocket, or one another
    stream reads, is refused at once (HandlerkitError).
    """
    socket = getattr(context, "cl_socket", None)
    if not isinstance(socket, ChunkSocket):
        raise HandlerkitError(
            f"streaming needs the context's cl_socket to be handlerkit's ChunkSocket: got {type(socket).__name__}",
            fix="use an hk.MockContext (its cl_socket records what the handler sends), or set "
            "context.cl_socket = handlerkit.worker.streaming.ChunkSocket()",
        )
    if socket.listener is not None:
        raise HandlerkitError(
            "another stream is already reading this context's chunks",
            fix="finish (or close) the other h.stream(...) generator first",
        )
    return _chunks_as_sent(run, context, socket)


def _chunks_as_sent(run: Callable[[], R], context: Any, socket: ChunkSocket) -> Generator[Chunk, None, R]:
    # Each frame with the request ids bound when it was sent (read in the sending thread): by the
    # time the reader decodes it the context may be bound to another batch (a failure's requests
    # run alone to find the one at fault).
    arrived: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = run()
        except BaseException as exc:  # handed to the generator's reader
            outcome["error"] = exc
        finally:
            arrived.put(None)

    socket.listener = lambda position: arrived.put((position, dict(context.request_ids or {})))
    worker = threading.Thread(target=work, name="handlerkit-stream", daemon=True)
    worker.start()
    try:
        while (sent := arrived.get()) is not None:
            try:
                chunks = socket.chunks(*sent)
            except FrameError:
                continue
            yield from chunks
    finally:
        worker.join()
        socket.listener = None
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
