"""TorchServe's frontend, written once and engine-free; the engines are thin transports on it.

TorchServe splits serving in two: its frontend forms batches, keeps sequences, streams, times
out and answers; its worker runs the handler. Here the worker is a
:class:`~handlerkit.service.Service` and the frontend is this package, so a handler behaves the
same on every engine (:mod:`handlerkit.serving.ray`, :mod:`handlerkit.serving.kserve`):

- :mod:`~handlerkit.serving.frontend.model`: :class:`Frontend`, one model's frontend, and its
  :class:`Settings` from ``model-config.yaml``;
- :mod:`~handlerkit.serving.frontend.dispatch`: how requests become batches, as strategy
  objects (TorchServe's batching, the async worker's, sequences, continuous batching);
- :mod:`~handlerkit.serving.frontend.handle_thread`: the one thread that runs ``handle``, its
  ``responseTimeout``, the failure answers and the one log of each failure's StageError;
- :mod:`~handlerkit.serving.frontend.enveloped`: a service envelope around a batch of several
  requests (KServe's protocols, batched).

HTTP itself is translated by :mod:`handlerkit.serving._http`; batches are formed by
:mod:`~handlerkit.serving.frontend.batcher`, sequences kept by :mod:`~handlerkit.serving.frontend.sequence_desk`,
streams routed by :mod:`~handlerkit.serving.frontend.streams`.
"""

from handlerkit.serving.frontend.dispatch import (
    AsyncDispatch,
    BatchDispatch,
    ContinuousDispatch,
    Dispatch,
    Job,
    SequenceDispatch,
)
from handlerkit.serving.frontend.handle_thread import HandleThread
from handlerkit.serving.frontend.model import Frontend, Settings, settings

__all__ = [
    "AsyncDispatch",
    "BatchDispatch",
    "ContinuousDispatch",
    "Dispatch",
    "Frontend",
    "HandleThread",
    "Job",
    "SequenceDispatch",
    "Settings",
    "settings",
]
