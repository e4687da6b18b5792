"""examples/simple as an MLServer custom runtime, the peer `benchmarks.grpc` serves over
MLServer's own gRPC (its users' way: a model folder with model-settings.json naming this
class, `mlserver start FOLDER`).

The arithmetic is the one every peer runs (`models.add_sub`: 32-bit wrap-around); inputs
and outputs go through MLServer's NumpyCodec, as a custom runtime's would.
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from .models import add_sub


class Simple(MLModel):  # type: ignore[misc]  # MLServer is installed in its own environment only
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [-1, 16])."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        a, b = arrays["INPUT0"], arrays["INPUT1"]
        added, subtracted = add_sub(a.ravel().tolist(), b.ravel().tolist())
        outputs = [NumpyCodec.encode_output(name, np.array(values, dtype=np.int32).reshape(a.shape))
                   for name, values in (("OUTPUT0", added), ("OUTPUT1", subtracted))]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
