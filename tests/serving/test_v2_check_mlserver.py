"""The v2 check against MLServer 1.7.1, a v2 server nobody here wrote, serving a small numpy
model (tests/_mlserver_runtime.py) on loopback from its own venv (``.venv-mlserver``).

What MLServer does not keep is pinned row by row, so a change either way shows:

- it hands a request to the runtime without checking its shape or datatype against the data or
  the metadata, and answers the runtime's exception with a plain-text 500 (wrong shape, wrong
  datatype: not a 4xx, no ``{"error": ...}``);
- FastAPI validates the body before MLServer sees it: malformed JSON and a body without
  ``inputs`` are answered 422 with FastAPI's ``{"detail": [...]}``, not ``{"error": ...}``.
"""

from __future__ import annotations

import _v2_servers
import pytest
from _v2_servers import mlserver_server, require_mlserver

from handlerkit.serving.v2_check import check

pytestmark = pytest.mark.v2server

MODEL = "row-sums"
SETTINGS = {
    "name": MODEL,
    "implementation": "_mlserver_runtime.RowSums",
    "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "sums", "datatype": "FP32", "shape": [-1, 1]}],
}
INFER = f"POST /v2/models/{MODEL}/infer"
ERROR_BODY = 'body is JSON {"error": <string>}'
QUIRKS = {
    (INFER, "wrong shape: answers 4xx"),
    (INFER, f"wrong shape: {ERROR_BODY}"),
    (INFER, "wrong datatype: answers 4xx"),
    (INFER, f"wrong datatype: {ERROR_BODY}"),
    (INFER, f"malformed JSON: {ERROR_BODY}"),
    (INFER, f"no inputs: {ERROR_BODY}"),
}


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory):
    require_mlserver()
    with mlserver_server(tmp_path_factory.mktemp("mlserver"), SETTINGS) as url:
        yield url


def test_mlserver_keeps_health_metadata_and_inference_and_these_rules_not(mlserver):
    report = check(mlserver)
    assert (report.model, report.discovered_by) == (MODEL, "POST /v2/repository/index")
    assert len(report.rows) == 24
    assert {(r.endpoint, r.rule) for r in report.failures} == QUIRKS, str(report)
    rows = {(r.endpoint, r.rule): r for r in report.rows}
    assert rows[("GET /v2", "name, version and extensions")].excerpt.startswith('{"name":"mlserver","version":"1.7.1"')
    for what in ("wrong shape", "wrong datatype"):
        row = rows[(INFER, f"{what}: answers 4xx")]
        assert (row.status, row.excerpt) == (500, "Internal Server Error")
    for what in ("malformed JSON", "no inputs"):
        row = rows[(INFER, f"{what}: {ERROR_BODY}")]
        assert row.status == 422 and row.excerpt.startswith('{"detail":[')
    unknown = rows[("POST /v2/models/handlerkit-no-such-model/infer", f"unknown model: {ERROR_BODY}")]
    assert unknown.ok and unknown.status == 404


def test_mlserver_answers_the_model_it_is_asked_for(mlserver):
    report = check(mlserver, MODEL)
    assert report.discovered_by is None and not report.ok
    assert report.passed(f"{INFER} (FP32, nested data)", "model_name, id and outputs (data fills shape)")


def test_a_missing_mlserver_venv_skips_with_the_install_command_or_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.setattr(_v2_servers, "MLSERVER", tmp_path / "no-venv" / "mlserver")
    monkeypatch.delenv("HANDLERKIT_REQUIRE_MLSERVER", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"pip install -c \.ci/mlserver-constraints\.txt mlserver==1\.7\.1"):
        require_mlserver()
    monkeypatch.setenv("HANDLERKIT_REQUIRE_MLSERVER", "1")
    with pytest.raises(pytest.fail.Exception, match="HANDLERKIT_REQUIRE_MLSERVER=1 but .*no-venv/mlserver is missing"):
        require_mlserver()
