"""A handler for ``service_envelope=kservev2``: the envelope hands it the request's inputs as
``{"name", "shape", "datatype", "data"}`` dicts, ``data`` already shaped by numpy."""

import numpy
import torch

from handlerkit.handlers.base import BaseHandler as Base


class V2Rows(Base):
    """The model on the first input's rows; the envelope turns the scores into ``outputs``."""

    def preprocess(self, data):
        return torch.as_tensor(numpy.asarray(data[0]["data"]), dtype=torch.float32)

    def postprocess(self, data):
        return [data.tolist()]  # one result per input: the envelope names each output after its input
