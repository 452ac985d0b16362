"""The v2 check against KServe 0.21's own ``kserve.ModelServer`` (a v2 server nobody here
wrote) serving :class:`RowSums`, a small numpy ``kserve.Model`` (not handlerkit), on loopback.

What KServe does not keep is pinned row by row (``KSERVE_QUIRKS``), so a change either way
shows. The server runs in a child process (tests/_v2_servers.py), narrowed to 127.0.0.1.
"""

from __future__ import annotations

import pytest
from _v2_servers import kserve_server

from handlerkit.serving.v2_check import check

pytestmark = pytest.mark.v2server

MODEL = "row-sums"
INFER = f"POST /v2/models/{MODEL}/infer"
ERROR_BODY = 'body is JSON {"error": <string>}'
#: KServe 0.21 does not check a request's shape or datatype before the model runs, and answers
#: the model's exception with a 500 (its body is {"error": ...}); FastAPI refuses malformed JSON
#: and a body without inputs with 422 and its own {"detail": [...]}, not {"error": ...}.
KSERVE_QUIRKS = {
    (INFER, "wrong shape: answers 4xx"),
    (INFER, "wrong datatype: answers 4xx"),
    (INFER, f"malformed JSON: {ERROR_BODY}"),
    (INFER, f"no inputs: {ERROR_BODY}"),
}


class RowSums:
    """Made a ``kserve.Model`` in the server's process (kserve is imported there, not here)."""

    @staticmethod
    def build(name: str):  # noqa: ANN205 - a kserve.Model
        import kserve
        import numpy as np
        from kserve import InferOutput, InferRequest, InferResponse

        class _RowSums(kserve.Model):
            def __init__(self) -> None:
                super().__init__(name)
                self.ready = True

            def get_input_types(self) -> list[dict]:
                return [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]

            def get_output_types(self) -> list[dict]:
                return [{"name": "sums", "datatype": "FP32", "shape": [-1, 1]}]

            async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
                features = payload.inputs[0].as_numpy()
                sums = features.reshape(features.shape[0], -1).sum(axis=1, keepdims=True).astype(np.float32)
                output = InferOutput(name="sums", shape=list(sums.shape), datatype="FP32")
                output.set_data_from_numpy(sums, binary_data=False)
                return InferResponse(response_id=payload.id, model_name=self.name, infer_outputs=[output])

        return _RowSums()


SETUP = f"""
from serving.test_v2_check_kserve import RowSums
models = [RowSums.build({MODEL!r})]
"""


@pytest.fixture(scope="module")
def kserve_url(tmp_path_factory: pytest.TempPathFactory):
    with kserve_server(SETUP, tmp_path_factory.mktemp("kserve")) as url:
        yield url


def test_kserve_keeps_health_metadata_and_inference_and_these_rules_not(kserve_url):
    report = check(kserve_url)
    assert (report.model, report.discovered_by) == (MODEL, "GET /v2/models")
    assert len(report.rows) == 24
    assert {(r.endpoint, r.rule) for r in report.failures} == KSERVE_QUIRKS, str(report)
    rows = {(r.endpoint, r.rule): r for r in report.rows}
    assert rows[("GET /v2", "name, version and extensions")].excerpt.startswith('{"name":"kserve","version":"0.21.0"')
    # the model's own exception comes back as {"error": "ValueError : ..."} with a 500
    shape = rows[(INFER, f"wrong shape: {ERROR_BODY}")]
    assert shape.ok and shape.status == 500 and shape.excerpt.startswith('{"error":"ValueError : cannot reshape')
    for what in ("malformed JSON", "no inputs"):
        row = rows[(INFER, f"{what}: {ERROR_BODY}")]
        assert row.status == 422 and row.excerpt.startswith('{"detail":[')
    # "versions": null where the spec says the field is optional: taken as absent
    assert '"versions":null' in rows[(f"GET /v2/models/{MODEL}", "answers 200")].excerpt


def test_kserve_answers_the_model_it_is_asked_for(kserve_url):
    report = check(kserve_url, MODEL)
    assert report.discovered_by is None
    assert report.passed(f"{INFER} (FP32, nested data)", "model_name, id and outputs (data fills shape)")
