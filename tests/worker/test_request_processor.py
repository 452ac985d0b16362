"""RequestProcessor, bind_requests and read_responses (handlerkit.worker.request_processor)."""

from __future__ import annotations

import pytest

from handlerkit.worker import context as context_module
from handlerkit.worker import request_processor
from handlerkit.worker.context import MockContext
from handlerkit.worker.request_processor import RequestProcessor, ResponseInfo, bind_requests, read_responses


def test_the_context_module_re_exports_them():
    for name in request_processor.__all__:
        assert getattr(context_module, name) is getattr(request_processor, name), name


def test_request_processor_defaults_and_setters():
    headers = {"explain": "True", "body": {"content-type": "image/png"}}
    rp = RequestProcessor(headers)
    assert rp.get_response_status_code() == 200
    assert rp.get_response_status_phrase() is None
    assert rp.get_response_headers() == {}
    assert rp.get_request_property("explain") == "True"
    assert rp.get_request_property("body") == {"content-type": "image/png"}
    assert rp.get_request_property("Explain") is None  # case-sensitive, as TorchServe
    assert rp.get_request_properties() is headers  # kept by reference, as TorchServe

    rp.report_status(404, reason_phrase="nope")
    assert (rp.get_response_status_code(), rp.get_response_status_phrase()) == (404, "nope")
    rp.report_status(500)
    assert rp.get_response_status_phrase() is None

    rp.add_response_property("content-type", "application/json")
    assert rp.get_response_header("content-type") == "application/json"
    assert rp.get_response_header("missing") is None
    assert rp.get_response_headers() == {"content-type": "application/json"}
    assert "500" in repr(rp)


def test_bind_requests_gives_fresh_processors_and_copies():
    ctx = MockContext()
    headers = [{"body": {"content-type": "text/plain"}}]
    assert bind_requests(ctx, {0: "req-0"}, headers) is ctx
    ctx.set_response_status(500, "boom")
    ctx.get_all_request_header(0)["body"]["content-type"] = "mutated"
    assert headers[0]["body"]["content-type"] == "text/plain"
    bind_requests(ctx, {0: "req-0"}, headers)
    assert ctx.get_response_status(0) == (200, None)
    assert ctx.metrics.request_ids == {0: "req-0"}
    with pytest.raises(ValueError, match="one header dict per request id"):
        bind_requests(ctx, {0: "a", 1: "b"}, [{}])


def test_read_responses_reads_what_the_handler_set():
    ctx = bind_requests(MockContext(), {0: "a", 1: "b"}, [{}, {}])
    ctx.set_response_status(404, "Not Found", idx=1)
    ctx.set_response_content_type(0, "text/plain")
    assert read_responses(ctx) == [ResponseInfo(200, None, {"content-type": "text/plain"}), ResponseInfo(404, "Not Found", {})]
    assert read_responses(ctx)[0].content_type == "text/plain"


def test_read_responses_on_plain_object():
    class Ctx:
        request_processor = None

    assert read_responses(Ctx()) == []
