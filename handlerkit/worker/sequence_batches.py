"""How TorchServe 0.12's frontend forms a stateful model's next batch (``SequenceBatching``,
``SequenceContinuousBatching``): one rule, shared by :class:`handlerkit.Sequences` (a Harness)
and the Ray replica's continuous-batching loop (:mod:`handlerkit.serving.frontend.continuous`).

- A batch holds at most ``batchSize`` requests; under continuous batching the running batch
  holds up to ``2 * batchSize`` (TorchServe 0.12 hard-codes the factor).
- The requests still running come first, in the order they run; then at most one new request
  per sequence, taken from the sequences in the order they opened, while there is room.
- A running request is sent again with the same request id and headers but no parameters
  (the frontend's ``setCachedInBackend``: the worker sees a data row ``{}``).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from typing import TypeVar

from handlerkit.worker.requests import Request

__all__ = ["CONTINUOUS_FACTOR", "capacity", "next_batch", "resent"]

T = TypeVar("T")

#: The running batch's size under continuous batching, in batchSizes (SequenceContinuousBatching).
CONTINUOUS_FACTOR = 2


def capacity(batch_size: int, continuous: bool) -> int:
    """The most requests one worker call holds."""
    return batch_size * CONTINUOUS_FACTOR if continuous else batch_size


def next_batch(running: list[T], queues: Iterable[deque[T]], size: int) -> tuple[list[T], list[T]]:
    """The next batch as ``(continued, joining)``: ``running`` first, then the head of each
    queue in turn (one per sequence, in ``queues``' order) until ``size`` requests; the joining
    ones are taken off their queues."""
    joining: list[T] = []
    for queue in queues:
        if len(running) + len(joining) >= size:
            break
        if queue:
            joining.append(queue.popleft())
    return list(running), joining


def resent(request: Request) -> Request:
    """``request`` as the frontend sends it again while it runs: same id and headers, no parameters."""
    return dataclasses.replace(request, parameters=(), delivered=None)
