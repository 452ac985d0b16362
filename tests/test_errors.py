"""Errors carry their fix as data; str() shows it once, after "fix:"."""

from __future__ import annotations

import pytest

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


def test_a_stage_errors_locations_are_innermost_last_and_survive_pickle_and_copy():
    import copy
    import pickle

    at = [("/m/handler.py", 19, "return self.model(*inputs)"), ("/m/model.py", 13, "items = self.items(item_ids)")]
    error = StageError("inference failed", stage="inference", request_index=1, locations=at, fix="f")
    assert error.locations == at and error.location == at[-1]  # location: the innermost, as before
    for twin in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error)):
        assert (twin.locations, twin.location, twin.request_index, twin.fix) == (at, at[-1], 1, "f")
    alone = StageError("x", stage="preprocess", location=at[0])  # built with location only, as before
    assert alone.locations == [at[0]] and StageError("x", stage="handle").locations == []
