"""The v2 check against handlerkit's own KServe adapter: ``handlerkit.serving.kserve.model``
(the fixture image classifier, a TorchServe-contract handler) served by ``kserve.ModelServer``
on loopback. The well-formed request carries a real image (base64 PNG in a ``BYTES`` input, as
TorchServe's kservev2 envelope hands it to the handler).

Every rule passes: the adapter checks each v2 input against the spec before the handler runs,
answers every v2 error with ``{"error": <message>}``, and turns FastAPI's 422 ``{"detail": [...]}``
for malformed JSON or a body without ``inputs`` into 400 ``{"error": ...}`` on the v2 routes
(tests/serving/test_v2_check_kserve.py pins FastAPI's own answer on a plain ``kserve.Model``).
"""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path

import pytest
from _v2_servers import kserve_server

from handlerkit.serving.v2_check import check

pytestmark = pytest.mark.v2server

ROOT = Path(__file__).resolve().parents[2]
CLASSIFIER = ROOT / "fixtures" / "models" / "image_classifier"
CIRCLE = ROOT / "fixtures" / "images" / "circle.png"
MODEL = "image_classifier"
INFER = f"POST /v2/models/{MODEL}/infer"
ERROR_BODY = 'body is JSON {"error": <string>}'
BAD_REQUESTS = ("wrong shape", "wrong datatype", "malformed JSON", "no inputs", "unknown model")

SETUP = f"""
from handlerkit.serving.kserve import model

served = model({str(CLASSIFIER)!r}, name={MODEL!r})
if not served.ready:
    served.load()
models = [served]
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    with kserve_server(SETUP, tmp_path_factory.mktemp("kserve_adapter")) as url:
        with urllib.request.urlopen(f"{url}/v2/models/{MODEL}", timeout=10) as response:
            declared = json.load(response)["inputs"]
        name = declared[0]["name"] if declared else "input-0"
        image = base64.b64encode(CIRCLE.read_bytes()).decode()
        yield check(url, MODEL, inputs=[{"name": name, "shape": [1], "datatype": "BYTES", "data": [image]}])


def test_the_adapter_answers_health_metadata_and_inference_as_the_spec_says(report):
    kept = [r for r in report.rows if not any(r.rule.startswith(f"{what}:") for what in BAD_REQUESTS)]
    assert [r for r in kept if not r.ok] == [], str(report)
    assert {r.endpoint for r in kept} >= {
        "GET /v2/health/live", "GET /v2/health/ready", "GET /v2", f"GET /v2/models/{MODEL}",
        f"GET /v2/models/{MODEL}/ready", f"{INFER} (BYTES, flat data)", f"{INFER} (BYTES, nested data)",
    }  # fmt: skip


def test_the_adapter_refuses_bad_requests_with_a_4xx_and_an_error(report):
    assert report.ok and report.failures == [], str(report)
    refused = [r for r in report.rows if r.rule.endswith(": answers 4xx")]
    assert len(refused) == 7 and {r.rule.split(":")[0] for r in refused} == set(BAD_REQUESTS)
    came = {r.rule: r.excerpt for r in report.rows if r.endpoint == INFER}
    assert came[f"wrong shape: {ERROR_BODY}"].startswith(
        '{"error": "invalid v2 inference request: input \'input-0\' shape [2] holds 2 elements, its data 1.'
    )
    assert came[f"malformed JSON: {ERROR_BODY}"].startswith(
        '{"error":"expected a v2 inference request, a JSON object with \'inputs\': malformed JSON at character 21'
    )
    assert came[f"no inputs: {ERROR_BODY}"].startswith('{"error":"expected a v2 inference request, a JSON object with \'inputs\': inputs: Field required')
