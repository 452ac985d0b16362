"""A small numpy model for MLServer (run by ``.venv-mlserver``, never imported by our venv).

``RowSums`` answers each row's sum of a ``features`` tensor (FP32, shape ``[-1, 4]``) as a
``sums`` tensor (FP32, ``[n, 1]``): tests/serving/test_v2_check_mlserver.py serves it with
``mlserver start`` and runs the Open Inference Protocol v2 check against it.
"""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class RowSums(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        features = NumpyCodec.decode_input(payload.inputs[0])
        sums = features.reshape(features.shape[0], -1).sum(axis=1, keepdims=True).astype(np.float32)
        return InferenceResponse(
            model_name=self.name, id=payload.id, outputs=[NumpyCodec.encode_output("sums", sums)]
        )
