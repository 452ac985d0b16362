"""TorchServe's BaseHandler as it is: preprocess is ``torch.as_tensor(data)``, so it serves the
flat instance lists a json or kserve envelope hands it (``service_envelope=json``)."""

from handlerkit.handlers.base import BaseHandler as Base


class Rows(Base):
    """The default stages, on the instances the envelope unwraps."""
