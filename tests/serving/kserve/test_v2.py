"""FastAPI's unreadable v2 bodies answered the v2 way (``handlerkit.serving.kserve._v2``), without a
server; tests/serving/test_v2_check_kserve_adapter.py sees it on a live one. The v2 rule itself is
tests/worker/test_v2_tensors.py's, its replies tests/serving/test_v2.py's."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from handlerkit.serving.kserve._v2 import request_validation_response


def test_fastapis_validation_errors_are_a_400_error_on_v2_routes_only():
    from fastapi.exceptions import RequestValidationError

    errors = [
        {"type": "missing", "loc": ("body", "InferenceRequest", "inputs"), "msg": "Field required"},
        {"type": "bytes_type", "loc": ("body", "bytes"), "msg": "Input should be a valid bytes"},
    ]
    exc = RequestValidationError(errors)
    v2 = SimpleNamespace(url=SimpleNamespace(path="/v2/models/m/infer"))
    response = asyncio.run(request_validation_response(v2, exc))
    assert response.status_code == 400 and json.loads(response.body) == {
        "error": "expected a v2 inference request, a JSON object with 'inputs': inputs: Field required. "
        'Fix: send {"inputs": [{"name": "input-0", "shape": [1, 3], "datatype": "FP32", "data": [0.5, 1.0, 1.5]}]}'
    }
    bad_json = RequestValidationError([{"type": "json_invalid", "loc": ("body", 21), "msg": "JSON decode error"}])
    response = asyncio.run(request_validation_response(v2, bad_json))
    assert "'inputs': malformed JSON at character 21. Fix:" in json.loads(response.body)["error"]
    other = SimpleNamespace(url=SimpleNamespace(path="/openai/v1/completions"))
    response = asyncio.run(request_validation_response(other, exc))
    assert response.status_code == 422 and json.loads(response.body)["detail"][0]["msg"] == "Field required"
