"""Service envelopes: handlerkit's against TorchServe 0.12's own classes, on the same data lists."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
from ts.context import Context as TSContext
from ts.context import RequestProcessor as TSRequestProcessor
from ts.torch_handler.request_envelope import body as ts_body
from ts.torch_handler.request_envelope import json as ts_json
from ts.torch_handler.request_envelope import kserve as ts_kserve
from ts.torch_handler.request_envelope import kservev2 as ts_kservev2

import handlerkit as hk
from handlerkit.errors import HandlerkitError, RequestError
from handlerkit.worker import clients
from handlerkit.worker import envelopes as env

TS_CLASSES = {
    "body": ts_body.BodyEnvelope,
    "json": ts_json.JSONEnvelope,
    "kserve": ts_kserve.KServeEnvelope,
    "kservev2": ts_kservev2.KServev2Envelope,
}
MANIFEST = {"model": {"modelName": "tiny", "modelVersion": "2.0"}}


class Recorder:
    """An inner handler that records (a deep copy of) what it gets and returns ``respond(data)``."""

    def __init__(self, respond=None):
        self.seen: list[Any] = []
        self.respond = respond or _echo

    def __call__(self, data, context):
        self.seen.append(copy.deepcopy(data))
        return self.respond(data)


def _echo(data):
    """One JSON-friendly item per item received (bytes as text, v2 input dicts as their data)."""
    out = []
    for item in data:
        if isinstance(item, (bytes, bytearray)):
            item = bytes(item).decode("latin-1")
        elif isinstance(item, dict) and "datatype" in item:
            item = item["data"]
        elif isinstance(item, dict):
            item = {k: bytes(v).decode("latin-1") if isinstance(v, (bytes, bytearray)) else v for k, v in item.items()}
        out.append(item)
    return out


def ts_context(b: hk.Batch) -> TSContext:
    """TorchServe's own Context, set up for the batch as ts.service.Service.predict does."""
    ctx = TSContext("tiny", "/tmp", copy.deepcopy(MANIFEST), len(b), None, "0.12.0")
    ctx.request_ids = b.request_ids
    ctx.request_processor = [TSRequestProcessor(h) for h in b.headers]
    return ctx


def hk_context(b: hk.Batch) -> hk.MockContext:
    ctx = hk.MockContext(gpu_id=None, manifest=copy.deepcopy(MANIFEST), model_name="tiny")
    return b.bind(ctx)


def both(name: str, b: hk.Batch, respond=None):
    """Run TorchServe's envelope and handlerkit's on the same batch: (seen, output) for each."""
    ts_rec, hk_rec = Recorder(respond), Recorder(respond)
    ts_out = TS_CLASSES[name](ts_rec).handle(b.data, ts_context(b))
    hk_out = env.wrap(hk_rec, name)(b.data, hk_context(b))
    return (ts_rec.seen, ts_out), (hk_rec.seen, hk_out)


def j(obj, **kw) -> hk.Request:
    return hk.Request.json(obj, **kw)


def as_bytes(obj) -> hk.Request:
    """A JSON body sent without a JSON content type: the handler gets a bytearray."""
    return hk.Request.from_bytes(json.dumps(obj).encode(), "application/octet-stream")


B64_A = base64.b64encode(b"a-bytes").decode()

FIDELITY = {
    "json 1x1": ("json", [j({"instances": [[1.0, 2.0]]})]),
    "json 1x3": ("json", [j({"instances": [[1, 2], [3, 4], [5, 6]]})]),
    "json 3 requests": ("json", [j({"instances": [1]}), j({"instances": [2, 3, 4]}), j({"instances": ["x", "y"]})]),
    "json b64 rows": ("json", [j({"instances": [{"b64": B64_A}, {"b64": B64_A}]}), j({"instances": [{"b64": B64_A}]})]),
    "json b64 columns": ("json", [j({"instances": [{"img": {"b64": B64_A}, "k": 3}, {"img": 1}]})]),
    "json form field": ("json", [hk.Request.form({"data": (json.dumps({"instances": [7, 8]}), "application/json")})]),
    "json bare dict": ("json", [{"instances": [[0.5]]}, {"instances": [[1.5]]}]),
    "kserve dict": ("kserve", [j({"instances": [{"data": [1, 2]}, {"data": [3, 4]}]})]),
    "kserve bytes": ("kserve", [as_bytes({"instances": ["a", "b", "c"]})]),
    "kserve explain": ("kserve", [j({"instances": [1]}, headers={"explain": "True"})]),
    "kservev2 id": ("kservev2", [j({"id": "abc", "inputs": [
        {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6.5]}]})]),
    "kservev2 no id": ("kservev2", [j({"inputs": [{"name": "x", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]}]})]),
    "kservev2 blank id, bytes body": ("kservev2", [as_bytes({"id": " ", "inputs": [
        {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["hello", "world"]},
        {"name": "b", "shape": [2, 1], "datatype": "BOOL", "data": [True, False]}]})]),
    "body 3 requests": ("body", [j([1, 2]), hk.Request.text("hi"), hk.Request.form({"data": b"\x00\x01"})]),
}


@pytest.mark.parametrize("case", list(FIDELITY), ids=list(FIDELITY))
def test_handler_gets_and_client_receives_what_torchserve_gives(case):
    name, requests = FIDELITY[case]
    b = hk.batch(*requests)
    (ts_seen, ts_out), (hk_seen, hk_out) = both(name, b)
    assert hk_seen == ts_seen
    assert hk_out == ts_out
    assert len(hk_out) == len(b)  # what the worker checks next


def test_json_flattens_instances_and_splits_back_per_request():
    b = hk.batch(j({"instances": [1]}), j({"instances": [2, 3, 4]}), j({"instances": [5, 6]}))
    _, (seen, out) = both("json", b, respond=lambda data: [x * 10 for x in data])
    assert seen == [[1, 2, 3, 4, 5, 6]]
    assert out == ['{"predictions": [10]}', '{"predictions": [20, 30, 40]}', '{"predictions": [50, 60]}']


def test_kservev2_reshapes_names_outputs_and_sets_context():
    b = hk.batch(j({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]},
                               {"name": "y", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}))
    ctx = hk_context(b)
    names = []

    def handler(data, context):
        names.append(context.input_names)
        assert data[1] == {"name": "y", "shape": [2], "datatype": "BYTES", "data": "a"}  # BYTES: data[0] only
        assert data[0]["data"] == [[1, 2], [3, 4]]
        return [np.array(data[0]["data"], dtype=np.float32) * 2]  # fewer outputs than inputs is fine
    out = env.wrap(handler, "kservev2")(b.data, ctx)
    assert names == [["x", "y"]]
    assert out == [{"id": b.request_ids[0], "model_name": "tiny", "model_version": "2.0",
                    "outputs": [{"name": "x", "datatype": "FP32", "data": [2.0, 4.0, 6.0, 8.0], "shape": (4,)}]}]
    assert not hasattr(ctx, "input_names") and not hasattr(ctx, "input_request_id")


@pytest.mark.parametrize("name", ["json", "kserve", "kservev2"])
@pytest.mark.parametrize("result", [None, []])
def test_empty_batch_and_empty_results_pass_through_as_in_torchserve(name, result):
    b = hk.batch(j({"instances": [1], "inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]}))
    (ts_seen, ts_out), (hk_seen, hk_out) = both(name, b, respond=lambda data: result)
    assert hk_out == ts_out == result and hk_seen == ts_seen
    for cls in (TS_CLASSES[name], env.get_envelope(name)):
        rec = Recorder(lambda data: result)
        assert cls(rec).handle([], hk_context(b)) == result and rec.seen == [[]]


def test_results_for_an_empty_batch_are_refused():
    with pytest.raises(HandlerkitError, match=r"returned list \[1\] for an empty batch") as info:
        env.wrap(lambda data, ctx: [1], "json")([], hk.MockContext())
    assert info.value.fix == "return [] for an empty batch"


# -------------------------------------------------------------- where TorchServe crashes or errs


@pytest.mark.parametrize(
    "request_, ts_error, match",
    [
        (as_bytes({"instances": [1]}), TypeError, r"request 1: the json envelope needs a parsed JSON object.*bytearray"),
        (hk.Request.text("1, 2"), TypeError, r"request 1: .*got a str"),
        (j({"inputs": [1]}), KeyError, r"request 1: .*non-empty list under 'instances': got keys \['inputs'\]"),
        (j({"instances": []}), IndexError, r"request 1: .*'instances': \[\]"),
        (j({"instances": [{"a": 1}, 2]}), AttributeError, r"request 1: instance 1 is a int but instance 0 is an object"),
        (j({"instances": [{"b64": "abc"}]}), ValueError, r"request 1: instance 0 holds invalid base64"),
    ],
    ids=["bytes body", "str body", "no instances", "empty instances", "mixed instances", "bad base64"],
)
def test_json_bad_request_is_a_request_error_where_torchserve_crashes(request_, ts_error, match):
    b = hk.batch(j({"instances": [0]}), request_)
    with pytest.raises(ts_error):
        TS_CLASSES["json"](Recorder()).handle(b.data, ts_context(b))
    with pytest.raises(RequestError, match=match) as info:
        env.wrap(Recorder(), "json")(b.data, hk_context(b))
    assert info.value.request_index == 1 and info.value.error_code == 400


def test_json_string_instances_are_refused_where_torchserve_splits_characters():
    b = hk.batch(j({"instances": "abc"}))
    rec = Recorder()
    TS_CLASSES["json"](rec).handle(b.data, ts_context(b))
    assert rec.seen == [["a", "b", "c"]]
    with pytest.raises(RequestError, match=r"non-empty list under 'instances': got 'instances': 'abc'"):
        env.wrap(Recorder(), "json")(b.data, hk_context(b))


def test_json_result_count_must_split_back_where_torchserve_misassigns():
    b = hk.batch(j({"instances": [1, 2]}), j({"instances": [3]}))
    ts_out = TS_CLASSES["json"](lambda d, c: [10, 20]).handle(b.data, ts_context(b))
    assert ts_out == ['{"predictions": [10, 20]}', '{"predictions": []}']  # request 1 silently gets nothing
    with pytest.raises(HandlerkitError, match=r"one item per instance: got 2 items for 3 instances \(requests of 2, 1\)"):
        env.wrap(lambda d, c: [10, 20], "json")(b.data, hk_context(b))


def test_json_unserialisable_or_ambiguous_results():
    b = hk.batch(j({"instances": [1, 2]}))
    with pytest.raises(TypeError):
        TS_CLASSES["json"](lambda d, c: [object(), 1]).handle(b.data, ts_context(b))
    with pytest.raises(HandlerkitError, match=r"predictions for request 0 are not JSON-serialisable") as info:
        env.wrap(lambda d, c: [object(), 1], "json")(b.data, hk_context(b))
    assert info.value.fix == "convert tensors and arrays with .tolist()"
    with pytest.raises(ValueError):
        TS_CLASSES["json"](lambda d, c: np.array([1, 2])).handle(b.data, ts_context(b))
    with pytest.raises(HandlerkitError, match=r"returned a ndarray, whose truth value is ambiguous"):
        env.wrap(lambda d, c: np.array([1, 2]), "json")(b.data, hk_context(b))


@pytest.mark.parametrize("name", ["kserve", "kservev2"])
def test_kserve_batches_are_refused_where_torchserve_reads_request_0_only(name):
    v2 = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [0]}]}
    b = hk.batch(*(j({"instances": [i], **v2}) for i in range(3)))
    rec = Recorder()
    out = TS_CLASSES[name](rec).handle(b.data, ts_context(b))
    assert len(rec.seen) == 1 and len(out) == 1  # the worker then answers 503 to all three
    with pytest.raises(HandlerkitError, match=rf"the {name} envelope reads only the first request of a batch: got 3") as info:
        env.wrap(Recorder(), name)(b.data, hk_context(b))
    assert "batchSize: 1" in info.value.fix


def test_kserve_bad_bodies():
    b = hk.batch(j({"inputs": []}))
    rec = Recorder(lambda data: [])
    TS_CLASSES["kserve"](rec).handle(b.data, ts_context(b))
    assert rec.seen == [None]  # TorchServe hands the handler None
    with pytest.raises(RequestError, match=r"request 0: the kserve body has no 'instances': keys \['inputs'\]"):
        env.wrap(Recorder(), "kserve")(b.data, hk_context(b))
    b = hk.batch(hk.Request.text('{"instances": [1]}'))
    with pytest.raises(AttributeError):
        TS_CLASSES["kserve"](Recorder()).handle(b.data, ts_context(b))
    with pytest.raises(RequestError, match=r"kserve envelope needs a JSON object with 'instances': got a str") as info:
        env.wrap(Recorder(), "kserve")(b.data, hk_context(b))
    assert "application/json" in info.value.fix


@pytest.mark.parametrize(
    "body, ts_error, match",
    [
        ({"instances": [1]}, KeyError, r"needs a list under 'inputs': got None"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]}, KeyError,
         r"kservev2 input 'x' shape None is not a list of integers >= 0"),
        ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2, 3]}]}, ValueError,
         r"kservev2 input 'x' shape \[2\] holds 2 elements, its data 3"),
        ({"id": 7, "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}, AttributeError,
         r"'id' must be a string: got 7"),
        ({"inputs": [{"name": "s", "shape": [0], "datatype": "BYTES", "data": []}]}, IndexError,
         r"BYTES input 's' needs a non-empty data list"),
    ],
    ids=["no inputs", "no shape", "wrong shape", "int id", "empty bytes"],
)
def test_kservev2_bad_request_is_a_request_error_where_torchserve_crashes(body, ts_error, match):
    b = hk.batch(j(body))
    with pytest.raises(ts_error):
        TS_CLASSES["kservev2"](Recorder()).handle(b.data, ts_context(b))
    with pytest.raises(RequestError, match=match):
        env.wrap(Recorder(), "kservev2")(b.data, hk_context(b))


@pytest.mark.parametrize(
    "tensor, match",
    [
        ({"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0, 2.0]},
         r"kservev2 input 'x' shape \[-1\] is not a list of integers >= 0"),
        ({"name": "x", "shape": [2], "datatype": "INT64", "data": ["1", "2"]},
         r"kservev2 input 'x' is INT64: its data must be integers, got '1'"),
        ({"name": "s", "shape": [1], "datatype": "BYTES", "data": ["a", "b"]},
         r"kservev2 input 's' shape \[1\] holds 1 elements, its data 2"),
        ({"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1.0]},
         r"kservev2 input 'x' datatype 'FLOAT' is none of BOOL, UINT8"),
    ],
    ids=["-1 dimension", "strings for INT64", "bytes data overfills shape", "unknown datatype"],
)
def test_kservev2_holds_inputs_to_the_v2_rule_that_torchserve_lets_through(tensor, match):
    b = hk.batch(j({"inputs": [tensor]}))
    seen = Recorder()
    TS_CLASSES["kservev2"](seen).handle(b.data, ts_context(b))  # TorchServe hands it to the handler
    assert len(seen.seen) == 1
    with pytest.raises(RequestError, match=match) as info:
        env.wrap(Recorder(), "kservev2")(b.data, hk_context(b))
    assert info.value.fix.startswith('send each input as {"name": "input-0"')


@pytest.mark.parametrize(
    "result, ts_error, match",
    [
        ([1, 2], IndexError, r"at most one result per input: got 2 results for inputs \['x'\]"),
        ([[1 + 2j]], KeyError, r"output 'x' has dtype complex128, which KServe v2 cannot name"),
    ],
    ids=["more outputs than inputs", "complex"],
)
def test_kservev2_bad_results(result, ts_error, match):
    b = hk.batch(j({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}))
    with pytest.raises(ts_error):
        TS_CLASSES["kservev2"](lambda d, c: result).handle(b.data, ts_context(b))
    with pytest.raises(HandlerkitError, match=match):
        env.wrap(lambda d, c: result, "kservev2")(b.data, hk_context(b))


def test_kservev2_does_not_reuse_a_stale_id():
    v2 = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
    with_id, without = hk.batch(j({"id": "old", **v2})), hk.batch(j(v2))
    outs = {}
    for side, make, cls in (("ts", ts_context, TS_CLASSES["kservev2"]), ("hk", hk_context, env.KServeV2Envelope)):
        results = [[], [1]]  # the first call's empty results leave the id on the context
        envelope = cls(lambda d, c: results.pop(0))
        ctx = make(with_id)
        envelope.handle(with_id.data, ctx)
        ctx.request_ids, ctx.request_processor = without.request_ids, make(without).request_processor
        outs[side] = envelope.handle(without.data, ctx)[0]["id"]
    assert outs == {"ts": "old", "hk": without.request_ids[0]}


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # TorchServe's np.array(tensor)
def test_kservev2_tensor_results_match_torchserve():
    import torch
    b = hk.batch(j({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0.1, 0.2]}]}))
    (_, ts_out), (_, hk_out) = both("kservev2", b, respond=lambda data: [torch.tensor(data[0]["data"]) * 3])
    assert hk_out == ts_out
    assert hk_out[0]["outputs"][0]["datatype"] == "FP32" and hk_out[0]["outputs"][0]["shape"] == (2,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # handlerkit's side converts tensors without numpy's warning
        env.wrap(lambda data, ctx: [torch.ones(2)], "kservev2")(b.data, hk_context(b))


# ---------------------------------------------------------------------------- names and wrap


def test_get_envelope_and_wrap():
    assert env.get_envelope("kservev2") is env.KServeV2Envelope
    assert set(env.ENVELOPES) == {"body", "json", "kserve", "kservev2"}
    handler = Recorder()
    assert env.wrap(handler, None) is handler and env.wrap(handler, "") is handler
    wrapped = env.wrap(handler, "json")
    assert isinstance(wrapped.__self__, env.JSONEnvelope)


@pytest.mark.parametrize("name, guess", [("kserve_v2", "kservev2"), ("KServe", "kserve"), ("jsn", "json")])
def test_unknown_envelope_names_the_known_ones(name, guess):
    with pytest.raises(HandlerkitError, match=rf"unknown service envelope '{name}': TorchServe 0.12 knows body, json, "
                       rf"kserve, kservev2 .*did you mean '{guess}'\?") as info:
        env.get_envelope(name)
    assert info.value.fix == f"use service_envelope={guess}"
    with pytest.raises(HandlerkitError, match=r"unknown service envelope 'grpc'.*\)\n  fix: use service_envelope=json$"):
        env.wrap(Recorder(), "grpc")


# ---------------------------------------------------------------------------- client builders


@pytest.mark.parametrize("name", ["json", "kserve"])
def test_instances_request_round_trips(name):
    instances = [[1.0, 2.0], {"x": 1, "y": "z"}]
    req = clients.request(name, instances, headers={"X-Trace": "1"}, request_id="rid-1")
    assert req.request_id == "rid-1" and req.headers["X-Trace"] == "1"
    b = hk.batch(req)
    assert b.data == [{"body": {"instances": instances}}]
    (ts_seen, ts_out), (hk_seen, hk_out) = both(name, b)
    assert hk_seen == ts_seen == [instances] and hk_out == ts_out
    assert clients.unwrap_response(name, hk_out[0]) == instances
    assert clients.unwrap_response(name, json.dumps(hk_out[0]) if name == "kserve" else hk_out[0].encode()) == instances


def test_json_request_sends_bytes_as_b64_and_the_handler_gets_bytes():
    req = clients.request("json", [{"img": b"\x89PNG", "k": 1}, {"img": b"GIF8"}])
    assert req.data()["body"]["instances"][0] == {"img": {"b64": base64.b64encode(b"\x89PNG").decode()}, "k": 1}
    (ts_seen, _), (hk_seen, _) = both("json", hk.batch(req))
    assert hk_seen == ts_seen == [[{"img": b"\x89PNG", "k": 1}, {"img": b"GIF8"}]]
    (ts_seen, _), (hk_seen, _) = both("json", hk.batch(clients.request("json", [b"raw"])))
    assert hk_seen == ts_seen == [[b"raw"]]


@pytest.mark.parametrize(
    "data, shape, datatype",
    [
        ([[1, 2, 3], [4, 5, 6]], [2, 3], "INT64"),
        ([[0.5, 1], [2, 3]], [2, 2], "FP64"),
        ([True, False], [2], "BOOL"),
        (["hello"], [1], "BYTES"),
        ("hello", [1], "BYTES"),
        (np.arange(6, dtype=np.float32).reshape(3, 2), [3, 2], "FP32"),
    ],
)
def test_kservev2_request_infers_shape_and_datatype_and_round_trips(data, shape, datatype):
    req = clients.request("kservev2", data, id="req-7")
    body = req.data()["body"]
    flat = body["inputs"][0]["data"]
    assert body["id"] == "req-7"
    assert {k: v for k, v in body["inputs"][0].items() if k != "data"} == {"name": "input-0", "shape": shape, "datatype": datatype}
    (ts_seen, ts_out), (hk_seen, hk_out) = both("kservev2", hk.batch(req))
    assert hk_seen == ts_seen and hk_out == ts_out
    assert hk_out[0]["id"] == "req-7"
    expected = flat[:1] if datatype == "BYTES" else flat  # TorchServe passes BYTES data[0] only
    assert clients.unwrap_response("kservev2", hk_out[0]) == {"input-0": expected}
    assert clients.unwrap_response("kservev2", json.dumps(hk_out[0])) == {"input-0": expected}


def test_kservev2_request_with_several_inputs():
    req = clients.request("kservev2", inputs={"a": [[1, 2]], "b": ["x", "y"]})
    assert [(i["name"], i["shape"], i["datatype"]) for i in req.data()["body"]["inputs"]] == [
        ("a", [1, 2], "INT64"), ("b", [2], "BYTES")]
    assert "id" not in req.data()["body"]
    ready = [{"name": "t", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    req = clients.request("kservev2", inputs=ready)
    assert req.data()["body"]["inputs"] == ready
    (ts_seen, ts_out), (hk_seen, hk_out) = both("kservev2", hk.batch(req))
    assert hk_seen == ts_seen == [[{"name": "t", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]]
    assert hk_out == ts_out and hk_out[0]["id"] == req.request_id


def test_module_imports_neither_torch_nor_torchserve_nor_numpy():
    code = "import sys, handlerkit.worker.envelopes; print(sorted(m for m in ('torch', 'ts', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
