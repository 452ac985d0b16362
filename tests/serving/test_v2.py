"""The v2 protocol as handlerkit's servers speak it (``handlerkit.serving.v2``): the spec's error
replies, the inputs and outputs a model declares, and **the v2 self-check**: ``handlerkit check
--protocol v2`` passes, with no ``--inputs``, against ``handlerkit serve --engine kserve`` of every
built-in handler and of a handler whose model-config.yaml declares its tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from handlerkit.cli import main
from handlerkit.errors import ConfigError, HandlerkitError
from handlerkit.handlers import ImageClassifier, ImageSegmenter, ObjectDetector, TextClassifier
from handlerkit.serving._http import Reply, worker_error
from handlerkit.serving._http import error_reply as ts_error
from handlerkit.serving.v2 import as_v2_error, declared_tensors, invalid_request

ROOT = Path(__file__).resolve().parents[2]
BUILT_INS = ("image_classifier", "image_segmenter", "object_detector", "text_classifier")

#: A handler nobody wrote for v2: rows of three features in, each row's weighted sum out.
SCORER_PY = '''\
class Scorer:
    def initialize(self, context):
        self.weights = [0.5, -1.0, 2.0]

    def handle(self, data, context):
        return [[sum(w * x for w, x in zip(self.weights, row)) for row in item["data"]] for item in data]
'''
SCORER_CONFIG = """\
v2:
  inputs: [{name: rows, datatype: FP32, shape: [-1, 3]}]
  outputs: [{name: rows, datatype: FP64, shape: [-1]}]
"""


def _scorer_dir(path: Path) -> Path:
    (path / "MAR-INF").mkdir(parents=True)
    (path / "scorer.py").write_text(SCORER_PY)
    (path / "model-config.yaml").write_text(SCORER_CONFIG)
    manifest = {"modelName": "scorer", "handler": "scorer.py", "modelVersion": "1.0", "configFile": "model-config.yaml"}
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"runtime": "python", "model": manifest}))
    return path


def _error(reply: Reply) -> tuple[int, str]:
    assert reply.headers == {"content-type": "application/json"}
    return reply.status, json.loads(reply.body)["error"]


# ------------------------------------------------------------------------------ error replies
def test_an_invalid_request_is_a_400_with_every_problem_and_the_fix():
    status, message = _error(invalid_request(["input 'x' has no data", "input 'y' has no data"]))
    assert status == 400
    assert message.startswith("invalid v2 inference request: input 'x' has no data; input 'y' has no data. Fix: send each input as {")


def test_v2_errors_keep_the_status_and_torchserves_message():
    assert _error(as_v2_error(worker_error(503, "Prediction failed"))) == (503, "Prediction failed")
    assert _error(as_v2_error(ts_error(404, "Model not found"))) == (404, "Model not found")
    # A handler's own status for one request: the error of its output item.
    answered = {"id": "a", "outputs": [{"name": "img", "shape": [1], "datatype": "BYTES",
                                        "data": [{"code": 400, "error": "not an image"}]}]}  # fmt: skip
    assert _error(as_v2_error(Reply(400, "Bad Request", {}, json.dumps(answered).encode()))) == (400, "not an image")
    assert _error(as_v2_error(Reply(422, "no values", {}, b"plain text"))) == (422, "no values: plain text")
    assert _error(as_v2_error(Reply(500, None, {}, b"x" * 3000))) == (500, "x" * 2000 + "…")


# ------------------------------------------------------------------------- declared tensors
@pytest.mark.parametrize("handler", [ImageClassifier, ImageSegmenter, ObjectDetector, TextClassifier])
def test_each_built_in_declares_one_bytes_input_of_any_length(handler):
    declared = declared_tensors({}, handler())
    assert declared["inputs"] == [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}]
    [output] = declared["outputs"]
    assert output["name"] == "input-0"  # TorchServe's kservev2 envelope names output i after input i
    assert declared["other_names"] is True  # a built-in reads any input name, pixels too


def test_model_config_declares_over_the_handler_and_binds_every_name():
    config = {"v2": {"inputs": [{"name": "rows", "datatype": "FP32", "shape": [-1, 3]}]}}
    assert declared_tensors(config, ImageClassifier()) == {
        "inputs": [{"name": "rows", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [],
        "other_names": False,
    }
    assert declared_tensors({}, object()) == {"inputs": [], "outputs": [], "other_names": False}


def test_a_handlers_bad_declaration_names_the_attribute_and_the_fix():
    class Typo:
        v2_metadata: ClassVar[dict[str, Any]] = {"inputs": [{"name": "x", "datatype": "FLOAT32", "shape": [3]}], "outputs": "x"}

    with pytest.raises(HandlerkitError, match=r"^Typo.v2_metadata declares no v2 metadata: inputs\[0\] datatype "
                       r"'FLOAT32' is none of BOOL, .*; outputs is str, not a list of tensors") as info:  # fmt: skip
        declared_tensors(None, Typo())
    assert info.value.fix.startswith('declare {"inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}]')


def test_model_config_v2_is_checked_when_the_config_is_read(tmp_path):
    import handlerkit as hk

    (tmp_path / "model-config.yaml").write_text("v2:\n  inputs: [{name: rows, datatype: float, shape: [-1, 3]}]\n  output: []\n")
    with pytest.raises(ConfigError, match=r"model-config.yaml: unknown key v2.output: v2 holds inputs and "
                       r"outputs; v2.inputs\[0\] datatype 'float' is none of BOOL") as info:  # fmt: skip
        hk.load_config(tmp_path / "model-config.yaml")
    assert info.value.fix == (
        "declare each tensor as {name, datatype, shape}: "
        "v2: {inputs: [{name: input-0, datatype: BYTES, shape: [-1]}], outputs: [...]}"
    )
    (tmp_path / "model-config.yaml").write_text("v2: [rows]\n")
    with pytest.raises(ConfigError, match=r"v2 must be a mapping of inputs and outputs, got list \['rows'\]"):
        hk.load_config(tmp_path / "model-config.yaml")
    (tmp_path / "model-config.yaml").write_text(SCORER_CONFIG)
    assert hk.load_config(tmp_path / "model-config.yaml").sections["v2"]["outputs"][0]["datatype"] == "FP64"


# ------------------------------------------------------------------------- the v2 self-check
@pytest.mark.v2server
@pytest.mark.parametrize("model", [*BUILT_INS, "scorer"])
def test_the_v2_check_passes_against_our_kserve_server_with_no_inputs(model, tmp_path, capsys):
    from handlerkit.serving.kserve import start

    path = _scorer_dir(tmp_path / "scorer") if model == "scorer" else ROOT / "fixtures" / "models" / model
    with start(path, log=tmp_path / "server.log", timeout=120) as server:
        code = main(["check", "--protocol", "v2", server.url, "--json"])
    report = json.loads(capsys.readouterr().out)
    failed = [row for row in report["rows"] if not row["ok"]]
    assert (code, failed) == (0, []), server.log.read_text()[-3000:]
    assert report["model"] == model and report["discovered_by"] == "GET /v2/models"
    kept = {row["endpoint"] for row in report["rows"]}
    datatype = "FP32" if model == "scorer" else "BYTES"
    for form in ("flat data", "nested data"):
        assert f"POST /v2/models/{model}/infer ({datatype}, {form})" in kept
    refused = {row["rule"] for row in report["rows"] if row["endpoint"] == f"POST /v2/models/{model}/infer"}
    assert {"wrong shape: answers 4xx", "wrong datatype: answers 4xx"} <= refused
