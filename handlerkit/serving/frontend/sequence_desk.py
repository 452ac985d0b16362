"""Stateful sequences on a serving replica, kept as TorchServe 0.12's frontend keeps them
(engine-free: no Ray import).

A model whose model-config.yaml says ``sequenceBatching: true`` serves sequences: requests
sharing a sequence id, whose state the handler keeps in its process. What TorchServe 0.12 does
over HTTP (read from the real server, ``tests/test_sequences_server.py``), and the replica with it:

- a request without ``ts_request_sequence_id`` opens a sequence named ``ts-seq-<uuid4>``; the
  handler sees that id and ``ts_request_sequence_start: "true"`` in its headers. The frontend
  does not send the id back: a handler that wants its client to continue sets the response
  header itself (TorchServe's ``sequence_continuous_batching`` example does); a client may
  also name its own sequences, as TorchServe's ``sequence_batching`` example does;
- the handler ends a sequence with the response header ``ts_request_sequence_end`` (ids joined
  by ``;``); a later request with that id opens it again, without the start header;
- past ``maxNumSequence`` open sequences a request that opens one more is answered 503 with the
  frontend's message (TorchServe's default when the config says nothing is 1; here: no limit,
  as :class:`handlerkit.Sequences`); ``sequenceMaxIdleMSec`` frees a sequence left idle.

**Routing on Ray Serve.** A sequence's state lives in one replica's handler, so every request of
it must reach that replica. The replica registers each sequence it opens with Ray Serve's model
multiplexing (``@serve.multiplexed``; the sequence id is the multiplexed model id), and Ray's
router sends a request carrying the header ``serve_multiplexed_model_id: <sequence id>`` to the
replica that registered it. Ray's HTTP proxy reads only that header (not
``ts_request_sequence_id``), so **a client sends both headers with every request after the
first** (the first, which opens the sequence, goes anywhere). A request naming a sequence this
replica does not hold without the routing header is answered 400 with that fix, rather than
open a second, empty copy of the sequence. Ray learns where an id lives asynchronously
(replicas push their ids every 0.1 s, then the controller tells the proxies): a step sent
sooner may be routed to another replica, which would open an empty copy of the sequence
(measured on 2 replicas, steps sent at once: 6 of 36 went astray). So on a deployment of
several replicas a sequence's first answer is held back ``ROUTING_SETTLE_S`` (0 of 36 astray),
and a client needs no pause of its own; one replica answers at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from handlerkit.serving._http import Reply, error_reply

__all__ = ["ROUTING_HEADER", "ROUTING_SETTLE_S", "Admitted", "SequenceDesk"]

SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END = (
    "ts_request_sequence_id",
    "ts_request_sequence_start",
    "ts_request_sequence_end",
)
#: The request header Ray Serve's proxy routes multiplexed requests by.
ROUTING_HEADER = "serve_multiplexed_model_id"
#: How long Ray Serve takes, in practice, to route by a newly registered sequence id (a replica
#: pushes its ids every 0.1 s; the controller then tells the proxies): a sequence's first answer
#: waits this long on a deployment of several replicas.
ROUTING_SETTLE_S = 0.5
#: TorchServe 0.12's answer to a request its frontend cannot queue.
_NO_WORKER = (
    'Model "{model}" has no worker to serve inference request. Please use scale workers API to add workers. '
    "If this is a sequence inference, please check if it is closed, or expired; or exceeds maxSequenceJobQueueSize"
)


class Admitted(NamedTuple):
    """A request let in: its sequence, the headers the frontend adds to it, whether it opened one."""

    sequence_id: str
    headers: dict[str, str]
    opened: bool


def _header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    """A header's value, its name matched as Ray's proxy matches it (case, ``-`` for ``_``)."""
    for key, value in headers:
        if key.lower().replace("-", "_") == name:
            return value
    return None


class SequenceDesk:
    """The sequences one replica holds: which are open, and since when each is idle.

    Args:
        model: the model name (in the 503 message).
        max_num_sequence: the most open at once (None: no limit).
        max_idle_s: a sequence idle longer is forgotten (None or 0: never).
        clock: seconds, monotonic (tests replace it).
    """

    def __init__(
        self,
        model: str,
        *,
        max_num_sequence: int | None = None,
        max_idle_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.max_num_sequence = max_num_sequence or None
        self.max_idle_s = max_idle_s or None
        self._clock = clock
        self.open: dict[str, float] = {}  # sequence id -> when last seen

    @classmethod
    def from_config(cls, model: str, config: Mapping[str, Any] | None) -> SequenceDesk | None:
        """The desk a model config asks for; None when it says no ``sequenceBatching``."""
        config = config or {}
        if not config.get("sequenceBatching"):
            return None
        idle_ms = config.get("sequenceMaxIdleMSec")
        return cls(
            model,
            max_num_sequence=int(config.get("maxNumSequence") or 0),
            max_idle_s=float(idle_ms) / 1000.0 if idle_ms else None,
        )

    def admit(self, headers: Iterable[tuple[str, str]]) -> Admitted | Reply:
        """Let a request in (its sequence headers as the frontend adds them), or the error reply."""
        headers = list(headers)
        now = self._clock()
        if self.max_idle_s is not None:
            for idle in [s for s, seen in self.open.items() if now - seen > self.max_idle_s]:
                del self.open[idle]
        sequence_id, routed = _header(headers, SEQUENCE_ID), _header(headers, ROUTING_HEADER)
        added: dict[str, str] = {}
        if not sequence_id:
            sequence_id = f"ts-seq-{uuid.uuid4()}"
            added = {SEQUENCE_ID: sequence_id, SEQUENCE_START: "true"}
        elif sequence_id not in self.open and routed != sequence_id:
            return error_reply(
                400,
                f"sequence {sequence_id} is not open on this replica and the request's {ROUTING_HEADER} header is "
                f"{routed!r}, not the sequence id: Ray Serve routes a sequence's requests to the replica holding it "
                f"by that header alone; send `{ROUTING_HEADER}: {sequence_id}` with every request of the sequence "
                "after the first",
            )
        opened = sequence_id not in self.open
        if opened and self.max_num_sequence is not None and len(self.open) >= self.max_num_sequence:
            return error_reply(503, _NO_WORKER.format(model=self.model), "ServiceUnavailableException")
        self.open[sequence_id] = now
        return Admitted(sequence_id, added, opened)

    def answered(self, headers: Mapping[str, str]) -> list[str]:
        """Forget the sequences an answer's ``ts_request_sequence_end`` ends; their ids."""
        value = next((v for k, v in headers.items() if k.lower() == SEQUENCE_END), "")
        ended = [s.strip() for s in str(value).split(";") if s.strip()]
        for sequence_id in ended:
            self.open.pop(sequence_id, None)
        return ended
