"""The Open Inference Protocol v2 check against a strict in-test server (tests/_v2_fake.py),
and against the same server breaking one rule at a time: every rule can fail."""

from __future__ import annotations

import json

import pytest
from _ts_server import free_ports
from _v2_fake import BREAKS, MODEL, fake_v2_server

from handlerkit.errors import HandlerkitError
from handlerkit.serving.v2_check import V2Report, check

M = f"GET /v2/models/{MODEL}"
INFER = f"POST /v2/models/{MODEL}/infer"
FLAT, NESTED = (f"{INFER} (BOOL, BYTES, FP32, INT64, {form} data)" for form in ("flat", "nested"))
UNKNOWN = "/v2/models/handlerkit-no-such-model"
ANSWER = "model_name, id and outputs (data fills shape)"
ERROR_BODY = 'body is JSON {"error": <string>}'
BUILT = "a request built from the metadata's inputs"

#: Each break of the fake server, and exactly the rows it must fail.
FAILS = {
    "live": {("GET /v2/health/live", "answers 200")},
    "ready": {("GET /v2/health/ready", "answers 200")},
    "server_status": {("GET /v2", "answers 200")},
    "server_fields": {("GET /v2", "name, version and extensions")},
    "metadata_status": {(M, "answers 200"), (INFER, BUILT)},
    "metadata_fields": {(M, "name, platform, inputs and outputs"), (INFER, BUILT)},
    "model_ready": {(f"{M}/ready", "answers 200")},
    "model_name": {(FLAT, ANSWER), (NESTED, ANSWER)},
    "id": {(FLAT, ANSWER), (NESTED, ANSWER)},
    "data_length": {(FLAT, ANSWER), (NESTED, ANSWER)},
    "no_outputs": {(FLAT, ANSWER), (NESTED, ANSWER)},
    "nested": {(NESTED, "answers 200")},
    "shape_unchecked": {(INFER, "wrong shape: answers 4xx"), (INFER, f"wrong shape: {ERROR_BODY}")},
    "datatype_unchecked": {(INFER, "wrong datatype: answers 4xx"), (INFER, f"wrong datatype: {ERROR_BODY}")},
    "json_500": {(INFER, "malformed JSON: answers 4xx")},
    "plain_errors": {
        *((INFER, f"{what}: {ERROR_BODY}") for what in ("wrong shape", "wrong datatype", "malformed JSON", "no inputs")),
        (f"GET {UNKNOWN}", f"unknown model: {ERROR_BODY}"),
        (f"POST {UNKNOWN}/infer", f"unknown model: {ERROR_BODY}"),
    },
    "inputs_optional": {(INFER, "no inputs: answers 4xx"), (INFER, f"no inputs: {ERROR_BODY}")},
    "unknown_200": {(f"GET {UNKNOWN}", "unknown model: answers 4xx"), (f"GET {UNKNOWN}", f"unknown model: {ERROR_BODY}")},
    "unknown_ready_200": {(f"GET {UNKNOWN}/ready", "unknown model: answers 4xx")},
}


def failed(report: V2Report) -> set[tuple[str, str]]:
    return {(row.endpoint, row.rule) for row in report.failures}


def test_a_server_keeping_every_rule_passes_them_all():
    with fake_v2_server() as url:
        report = check(url)
    assert report.ok, str(report)
    assert report.model == MODEL and report.discovered_by == "GET /v2/models"
    assert len(report.rows) == 24
    # the strict server refused nothing: every input was built from the metadata, -1 filled with 1,
    # values of each datatype (BOOL, BYTES, FP32, INT64), flat and nested
    assert report.passed(FLAT, ANSWER) and report.passed(NESTED, ANSWER)
    assert report.passed(INFER, "wrong shape: answers 4xx")


@pytest.mark.parametrize("broken", sorted(FAILS))
def test_each_broken_rule_fails_its_rows_and_no_others(broken):
    with fake_v2_server(broken) as url:
        report = check(url)
    assert not report.ok
    assert failed(report) == FAILS[broken], str(report)
    for row in report.failures:
        assert row.detail, row  # a failed row says what was wrong


def test_every_break_of_the_fake_server_is_tested():
    assert set(FAILS) | {"no_listing", "two_models"} == set(BREAKS)


def test_a_failed_row_says_what_came_back():
    with fake_v2_server("live", "json_500") as url:
        report = check(url)
    live = next(r for r in report.rows if r.endpoint == "GET /v2/health/live")
    assert (live.ok, live.status, live.detail) == (False, 503, "expected 200, got 503")
    malformed = next(r for r in report.rows if r.rule == "malformed JSON: answers 4xx")
    assert (malformed.status, malformed.excerpt) == (500, '{"error": "malformed JSON"}')
    assert malformed.detail == "expected a 4xx status, got 500"


def test_the_report_renders_as_a_table_and_as_json():
    with fake_v2_server("id") as url:
        report = check(url)
    text = str(report)
    assert " ".join(text.split()).startswith(
        f"Open Inference Protocol v2: 22 of 24 rules pass; model {MODEL} (found by GET /v2/models) at {url}"
    )
    assert "\nFAILED\n" in text and "id None is not the" in text  # the failure, said once (its cells wrap)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert report.failures[0].detail == "id None is not the request's 'handlerkit-v2-check'"
    assert repr(report).startswith("<V2Report Open Inference Protocol v2")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and data["model"] == MODEL and data["url"] == url
    assert len(data["rows"]) == 24
    assert {"endpoint", "rule", "ok", "status", "excerpt", "detail"} == set(data["rows"][0])
    assert "text/html" in report._repr_mimebundle_()
    with pytest.raises(KeyError, match="no row for 'GET /nowhere'"):
        report.passed("GET /nowhere", "answers 200")


def test_a_model_is_named_when_the_server_lists_none_or_several():
    with fake_v2_server("no_listing") as url:
        with pytest.raises(HandlerkitError, match="no model named and none listed at .*tried GET /v2/models") as info:
            check(url)
        assert info.value.fix == "name the model: --model NAME (or check(url, model=...))"
        assert check(url, MODEL).ok
    with fake_v2_server("two_models") as url:
        with pytest.raises(HandlerkitError, match=r"expected one model .* GET /v2/models lists 2 \(fake-model, other\)"):
            check(url)
        report = check(url, MODEL)
        assert report.ok and report.discovered_by is None


def test_nothing_listening_and_a_bad_url_are_errors_with_a_fix():
    (port,) = free_ports(1)
    with pytest.raises(HandlerkitError, match=f"expected an Open Inference Protocol v2 server at http://127.0.0.1:{port}: no answer") as info:
        check(f"http://127.0.0.1:{port}", "m", timeout=2)
    assert "start the server" in info.value.fix
    with pytest.raises(HandlerkitError, match="expected the server's base URL, like http://127.0.0.1:8080: got '127.0.0.1:8080'"):
        check("127.0.0.1:8080")


def test_given_inputs_replace_the_ones_built_from_the_metadata():
    rows = [{"name": "features", "shape": [2, 3], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 1.0, 2.0, 3.0]}]
    with fake_v2_server() as url:
        report = check(url, MODEL, inputs=rows)
        assert report.ok, str(report)
        assert report.passed(f"{INFER} (FP32, nested data)", ANSWER)  # sent as [[0.1, 0.2, 0.3], [1.0, 2.0, 3.0]]
        refused = check(url, MODEL, inputs=[{**rows[0], "name": "unknown"}])
    assert refused.failures[0].endpoint == f"{INFER} (FP32, flat data)"
    assert refused.failures[0].excerpt == '{"error": "unknown input \'unknown\'"}'


@pytest.mark.parametrize("inputs, message", [
    ([], "expected a non-empty list"),
    ([{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0]}], r"inputs\[0\] shape \[2\] holds 2 elements, its data 1"),
    ([{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0]}], r"inputs\[0\] shape \[-1\] is not a list of integers >= 0"),
    ([{"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1.0]}], r"inputs\[0\] datatype 'FLOAT' is none of BOOL"),
])  # fmt: skip
def test_given_inputs_must_be_v2_request_inputs(inputs, message):
    with pytest.raises(HandlerkitError, match=r"expected v2 request inputs \(\{name, shape, datatype, data\} each\): " + message):
        check("http://127.0.0.1:9", "m", inputs=inputs)
