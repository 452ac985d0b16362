"""Per-request errors shared by the built-in handlers: the error, its status, its item, its place."""

from __future__ import annotations

import pytest

import handlerkit as hk
from handlerkit.errors import RequestError
from handlerkit.handlers.request_errors import STATUS_PHRASES, error_item, fail, payload_kind, put_back, request_error, set_status


def test_request_error_names_the_request_and_keeps_code_and_fix():
    error = request_error(3, "the body is empty", "send text", 413)
    assert isinstance(error, RequestError)
    assert (error.request_index, error.error_code, error.fix) == (3, 413, "send text")
    assert error.reason == "request 3: the body is empty"
    assert request_error(0, "x", "y").error_code == 400


@pytest.mark.parametrize(
    "payload, kind",
    [({"a": 1}, "a JSON object"), ([1], "a JSON array"), (True, "a JSON boolean"), (3, "a JSON number"),
     (2.5, "a JSON number"), (None, "a NoneType"), (object(), "a object")],
)
def test_payload_kind(payload, kind):
    assert payload_kind(payload) == kind


def test_error_item_drops_the_request_prefix():
    item = error_item(request_error(2, "a JSON object is not text", "send a string"))
    assert item == {"code": 400, "error": "a JSON object is not text", "fix": "send a string"}


def _bound_context(size: int) -> hk.MockContext:
    ctx = hk.MockContext()
    hk.batch(*(hk.Request.text("x") for _ in range(size))).bind(ctx)
    return ctx


def test_fail_records_the_error_and_sets_the_status():
    ctx = _bound_context(2)
    errors: dict[int, RequestError] = {}
    big = request_error(1, "too long", "split it", 413)
    fail(errors, 1, big, ctx)
    assert errors == {1: big}
    assert ctx.get_response_status(1) == (413, STATUS_PHRASES[413])
    assert ctx.get_response_status(0) == (200, None)


@pytest.mark.parametrize(("code", "phrase"), [(400, "Bad Request"), (413, "Payload Too Large"),
                                             (422, "Unprocessable Entity"), (418, "I'm a Teapot"),
                                             (499, "Bad Request"), (599, "Internal Server Error")])
def test_each_code_gets_its_phrase_and_a_context_without_statuses_is_fine(code, phrase):
    ctx = _bound_context(1)
    set_status(ctx, 0, request_error(0, "teapot", "brew coffee", code))
    assert ctx.get_response_status(0) == (code, phrase)
    set_status(None, 0, request_error(0, "x", "y"))
    set_status(object(), 0, request_error(0, "x", "y"))  # TorchServe's test MockContext has no statuses


def test_put_back_puts_each_item_at_its_index():
    errors = {0: request_error(0, "a", "fa"), 2: request_error(2, "b", "fb")}
    out = put_back(["x", "y"], errors, 4)
    assert out == [error_item(errors[0]), "x", error_item(errors[2]), "y"]


def test_put_back_is_idempotent_and_leaves_other_values_alone():
    errors = {1: request_error(1, "a", "fa")}
    once = put_back(["x", "y"], errors, 3)
    assert put_back(once, errors, 3) is once  # already one per request
    assert put_back("not a list", errors, 3) == "not a list"
    assert put_back(["x"], errors, 3) == ["x"]  # neither one per readable request nor per request
    assert put_back(["x", "y"], {}, 2) == ["x", "y"]
    assert put_back([], {0: request_error(0, "a", "fa")}, 1) == [error_item(request_error(0, "a", "fa"))]
