"""The TorchServe model: what TorchServe's Python worker does, written once.

TorchServe splits serving in two: a frontend (batches, sequences, streams, timeouts, answers)
and a Python worker that loads a model and runs its handler. This package is the worker's half,
engine-free and below every handler:

- the context a handler receives (:mod:`~handlerkit.worker.context`, its
  :mod:`~handlerkit.worker.request_processor` and :mod:`~handlerkit.worker.metrics`, with
  :mod:`~handlerkit.worker.metrics_config`);
- what a request is and how a batch is bound (:mod:`~handlerkit.worker.requests`,
  :mod:`~handlerkit.worker.batches`, :mod:`~handlerkit.worker.sequence_batches`), the bytes on
  the wire (:mod:`~handlerkit.worker._wire`) and the server envelopes
  (:mod:`~handlerkit.worker.envelopes`);
- the handler's contract (:mod:`~handlerkit.worker.contract`);
- a model dir, its ``model-config.yaml`` and ``pt2`` section (:mod:`~handlerkit.worker.modeldir`,
  :mod:`~handlerkit.worker.config`, :mod:`~handlerkit.worker.pt2`);
- loading a handler as the worker does, in import isolation, and whether the loaded code is the
  code on disk (:mod:`~handlerkit.worker.loading`, :mod:`~handlerkit.worker.isolation`,
  :mod:`~handlerkit.worker.freshness`, :mod:`~handlerkit.worker.workdir`);
- the async worker and streaming (:mod:`~handlerkit.worker.async_worker`,
  :mod:`~handlerkit.worker.streaming`);
- the facts a run is measured with (:mod:`~handlerkit.worker.devices`,
  :mod:`~handlerkit.worker.timer`, :mod:`~handlerkit.worker.memory`).

Nothing is imported here: each module is imported where it is used.
"""
