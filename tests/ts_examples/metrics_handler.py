"""Metrics declared in a metrics.yaml and fetched with ``get_metric``, shaped like pytorch/serve
examples/custom_metrics/mnist_handler.py.

``get_metric`` only finds what the worker's metrics cache declared from the metrics config
(``model_metrics`` section); TorchServe's default config declares only HandlerTime and
PredictionTime, so anything else raises a KeyError (MetricsCacheKeyError).
"""

import torch

from handlerkit.handlers.base import BaseHandler as Base
from handlerkit.worker.metrics import MetricType


class CountingMetrics(Base):
    """The model on JSON lists, counting requests and the batch size in declared metrics."""

    def preprocess(self, data):
        metrics = self.context.metrics
        metrics.get_metric("InferenceRequestCount", MetricType.COUNTER).add_or_update(len(data), [])
        batch_size = metrics.get_metric("RequestBatchSize", MetricType.GAUGE)
        batch_size.add_or_update(len(data), [self.context.model_name])
        rows = [row.get("data") or row.get("body") for row in data]
        return torch.tensor(rows, dtype=torch.float32)
