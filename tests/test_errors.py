"""Errors carry their fix as data; str() shows it once, after "fix:"."""

from __future__ import annotations

import pytest

from handlerkit import _failures
from handlerkit.errors import (
    ConfigError,
    HandlerkitError,
    HandlerLoadError,
    ModelLoadError,
    PredictionException,
    RequestError,
    StageError,
)


def test_the_fix_is_a_field_and_str_shows_it_on_its_own_line():
    error = HandlerkitError("the model dir is empty", fix="archive the model with torch-model-archiver")
    assert error.message == "the model dir is empty"
    assert error.fix == "archive the model with torch-model-archiver"
    assert str(error) == "the model dir is empty\n  fix: archive the model with torch-model-archiver"
    assert str(HandlerkitError("no fix known")) == "no fix known" and HandlerkitError("x").fix is None


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("bad", fix="f", problems=["a: bad", "b: bad"]),
        ModelLoadError("bad", "/m/model.pt", fix="f"),
        HandlerLoadError("bad", fix="f"),
        StageError("bad", stage="preprocess", fix="f"),
        RequestError("bad", 3, fix="f"),
    ],
)
def test_every_error_type_takes_a_fix(error):
    assert isinstance(error, HandlerkitError) and error.fix == "f" and str(error) == "bad\n  fix: f"


def test_config_error_lists_its_problems():
    assert ConfigError("one").problems == ["one"]
    assert ConfigError("two", problems=["a", "b"]).problems == ["a", "b"]


def test_request_error_is_a_400_prediction_exception_with_its_index():
    error = RequestError("request 2: not an image", 2, fix="send a PNG")
    assert isinstance(error, PredictionException) and isinstance(error, ValueError)
    assert (error.error_code, error.request_index, error.reason) == (400, 2, "request 2: not an image")
    assert error.message == "request 2: not an image\n  fix: send a PNG"  # what TorchServe answers the client
    assert str(PredictionException("teapot", 418)) == "teapot : 418"


def test_a_stage_error_from_a_foreign_exception_points_at_the_raising_line(tmp_path):
    source = tmp_path / "my_handler.py"
    source.write_text("def preprocess(data):\n    return data[0]['image']\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    try:
        namespace["preprocess"]([{"body": b""}])
    except KeyError as exc:
        error = _failures.stage_error("preprocess", exc, handler="MyHandler", request_index=0, handler_files={str(source)})
    assert error.location == (str(source), 2, "return data[0]['image']")
    assert f"at {source}:2: return data[0]['image']" in error.message
    assert error.stage == "preprocess" and error.request_index == 0 and isinstance(error.original, KeyError)
    assert error.fix.startswith("a request lacks the field")  # KeyError in preprocess: the usual cause


def test_a_stage_error_without_a_known_cause_names_the_line_in_its_fix(tmp_path):
    source = tmp_path / "h.py"
    source.write_text("def inference(x):\n    raise RuntimeError('the frobnicator broke')\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    try:
        namespace["inference"](1)
    except RuntimeError as exc:
        error = _failures.stage_error("inference", exc, handler="H", request_index=None, handler_files=set())
    assert "for the batch: RuntimeError: the frobnicator broke" in error.message
    assert error.fix == "RuntimeError was raised at h.py line 2; correct it there, then h.reload() and run inference again"


def test_handlerkit_errors_keep_their_own_fix_in_a_stage_error():
    try:
        raise RequestError("request 1: empty body", 1, fix="send the image as the body")
    except RequestError as exc:
        error = _failures.stage_error("preprocess", exc, handler="H", request_index=1)
    assert error.fix == "send the image as the body"
    assert "preprocess failed in H for request 1: RequestError: request 1: empty body" in error.message


def test_a_handlerkit_error_in_a_stage_states_its_fix_once():
    from handlerkit._failures import stage_error

    own = HandlerkitError("the model dir does not exist", fix="point the context at the model dir")
    error = stage_error("initialize", own, handler="H", request_index=None)
    assert str(error).count("point the context at the model dir") == 1
    assert error.fix == "point the context at the model dir"
