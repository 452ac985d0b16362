"""State kept across requests per sequence id, shaped like pytorch/serve
examples/stateful/stateful_handler.py (which keeps the sums in an LRU cache).

``context.get_sequence_id(idx)`` reads the ``ts_request_sequence_id`` header (the name comes
from ``TS_REQUEST_SEQUENCE_ID``) that the frontend sets for sequence-batching models.
"""

from handlerkit.handlers.base import BaseHandler as Base


class RunningSum(Base):
    """Each request adds its integer body to its sequence's running total and gets the total."""

    def initialize(self, context):
        self.context = context
        self.totals = {}
        self.initialized = True

    def preprocess(self, data):
        totals = []
        for idx, row in enumerate(data):
            key = self.context.get_sequence_id(idx)
            value = row.get("data") or row.get("body")
            if isinstance(value, (bytes, bytearray)):
                value = value.decode("utf-8")
            self.totals[key] = self.totals.get(key, 0) + int(value)
            totals.append(self.totals[key])
        return totals

    def inference(self, data, *args, **kwargs):
        return data

    def postprocess(self, data):
        return data
