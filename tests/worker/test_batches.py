"""Batches (handlerkit.worker.batches): what handle() gets, binding, raw data lists, the worker wire."""

from __future__ import annotations

import struct

import pytest

import handlerkit as hk
from handlerkit.worker import batches, requests
from handlerkit.worker.batches import Batch, batch
from handlerkit.worker.context import MockContext
from handlerkit.worker.requests import Parameter, Request

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


@pytest.fixture(autouse=True)
def _default_decoding(monkeypatch):
    monkeypatch.delenv("TS_DECODE_INPUT_REQUEST", raising=False)


def test_batch_names_live_in_batches():
    assert batches.Batch is hk.Batch and batches.batch is hk.batch
    assert not hasattr(requests, "Batch")  # requests is below batches: no re-export, no cycle


# --------------------------------------------------------------------------------------------
# Batches of requests
# --------------------------------------------------------------------------------------------


def test_batch_request_ids_and_sequence():
    a, b = Request.text("a", request_id="id-a"), Request.text("b", request_id="id-b")
    bt = batch(a, b)
    assert bt.request_ids == {0: "id-a", 1: "id-b"}
    assert len(bt) == 2
    assert bt[0] is a and bt[-1] is b
    assert list(bt) == [a, b]
    assert bt.requests == (a, b)
    sub = bt[1:]
    assert isinstance(sub, Batch) and sub.request_ids == {0: "id-b"}
    with pytest.raises(ValueError, match="empty"):
        bt[5:]
    assert "2 requests" in repr(bt) and "text/plain 1 B" in repr(bt)


def test_batch_argument_errors():
    with pytest.raises(ValueError, match="at least one request"):
        batch()
    with pytest.raises(TypeError, match=r"batch\(\*requests\)"):
        batch([Request.text("a")])
    assert batch(3).data == [3]  # any other item is delivered as it is


# --------------------------------------------------------------------------------------------
# bind() and mutation safety
# --------------------------------------------------------------------------------------------


def test_bind_onto_mock_context():
    ctx = MockContext()
    req0 = Request.from_bytes(PNG, "image/png", headers={"explain": "True"}, request_id="r0")
    req1 = Request.json({"a": 1}, request_id="r1")
    bt = batch(req0, req1)
    assert bt.bind(ctx) is ctx
    assert ctx.request_ids == {0: "r0", 1: "r1"}
    assert ctx.get_request_id(1) == "r1"
    assert ctx.get_request_header(0, "explain") == "True"
    assert ctx.get_request_header(1, "explain") == "False"  # the frontend's, for /predictions
    assert ctx.get_request_header(1, "url_path") == ""
    assert ctx.get_request_header(0, "body") == {"content-type": "image/png"}
    assert ctx.get_request_header(1, "Content-Type") == "application/json"
    assert ctx.get_request_header(1, "content-type") is None  # names are case-sensitive
    assert ctx.metrics.request_ids == {0: "r0", 1: "r1"}
    ctx.metrics.add_time("T", 1.0, idx=1)
    assert ctx.metrics.last("T").request_id == "r1"


def test_bind_resets_statuses_from_a_previous_call():
    ctx = MockContext()
    bt = batch(Request.text("a"))
    bt.bind(ctx)
    ctx.set_response_status(500, "boom")
    ctx.get_all_request_header(0)["injected"] = "x"
    bt.bind(ctx)
    assert ctx.get_response_status(0) == (200, None)
    assert ctx.get_request_header(0, "injected") is None
    assert "injected" not in bt.headers[0]


def test_data_is_fresh_on_every_access():
    bt = batch(Request.from_bytes(PNG, "image/png"), Request.json({"k": [1]}))
    first = bt.data
    first[0]["body"][0:4] = b"XXXX"
    first[1]["body"]["k"].append(2)
    first.append({"extra": 1})
    second = bt.data
    assert second[0]["body"] == bytearray(PNG)
    assert second[1]["body"] == {"k": [1]}
    assert len(second) == 2
    assert second[0]["body"] is not first[0]["body"]
    assert bt.requests[0].parameters[0].value == PNG
    headers = bt.headers
    headers[0]["body"]["content-type"] = "changed"
    assert bt.headers[0]["body"] == {"content-type": "image/png"}


# --------------------------------------------------------------------------------------------
# coerce and raw data dicts
# --------------------------------------------------------------------------------------------


def test_coerce_variants():
    req = Request.text("a")
    bt = batch(req)
    assert Batch.coerce(bt) is bt
    assert Batch.coerce(req).requests == (req,)
    assert Batch.coerce([req, req]).requests == (req, req)
    assert len(Batch.coerce({"data": 1})) == 1
    with pytest.raises(TypeError, match="expected a batch"):
        Batch.coerce("text")


def test_coerce_raw_data_dicts_are_delivered_as_they_are():
    class Thing:  # no HTTP form at all
        def __init__(self):
            self.n = 1

    raw = [{"data": bytearray(b"img")}, {"data": {"a": [1]}, "name": "x"}, {"tensor": Thing()}]
    bt = Batch.coerce(raw)
    data = bt.data
    assert data[:2] == raw[:2]
    assert type(data[0]["data"]) is bytearray
    assert isinstance(data[2]["tensor"], Thing) and data[2]["tensor"] is not raw[2]["tensor"]
    data[1]["data"]["a"].append(2)
    assert raw[1]["data"] == {"a": [1]} and bt.data[1]["data"] == {"a": [1]}
    assert len(bt.request_ids) == 3 and len(set(bt.request_ids.values())) == 3
    frontend = {"url_path": "", "explain": "False"}
    assert bt.headers == [
        {"data": {"content-type": "application/octet-stream"}, **frontend},
        {"data": {"content-type": "application/json"}, "name": {"content-type": "text/plain"}, **frontend},
        {"tensor": {"content-type": ""}, **frontend},
    ]
    # Values with an HTTP form become the request that would deliver them ...
    assert bt[1].parameters == (
        Parameter("data", b'{"a": [1]}', "application/json"),
        Parameter("name", b"x", "text/plain"),
    )
    assert bt[1].request_id == bt.request_ids[1]
    # ... the others cannot go on the wire.
    with pytest.raises(TypeError, match="'tensor' holds a Thing, which has no HTTP form"):
        bt.encode()
    assert "as-is tensor: Thing" in repr(bt)
    assert bt[2].wire_problem() and bt[1].wire_problem() is None
    ctx = MockContext()
    bt.bind(ctx)
    assert ctx.get_request_header(1, "name") == {"content-type": "text/plain"}


def test_mixed_requests_and_dicts():
    bt = batch(Request.text("a"), {"data": "b"})
    assert bt.data == [{"body": "a"}, {"data": "b"}]


def test_split_keeps_ids_and_decoding():
    bt = batch(Request.json({"a": 1}, request_id="a"), {"t": object()}, decode=False)
    parts = bt.split()
    assert [len(p) for p in parts] == [1, 1]
    assert [p.request_ids for p in parts] == [{0: "a"}, {0: bt.request_ids[1]}]
    assert all(p.decode is False for p in parts)
    assert parts[0].data == [{"body": bytearray(b'{"a": 1}')}]


# --------------------------------------------------------------------------------------------
# Worker message and wire encoding (checked against TorchServe itself in test_wire.py)
# --------------------------------------------------------------------------------------------


def test_to_worker_message_shape():
    req = Request.from_bytes(b"\x01", "image/png", headers={"explain": "True"}, request_id="r0")
    (msg,) = batch(req).to_worker_message()
    assert msg["requestId"] == bytearray(b"r0") and type(msg["requestId"]) is bytearray
    # The frontend's headers first, yours over them (explain: True is the explanations API).
    assert msg["headers"] == [
        {"name": bytearray(b"url_path"), "value": bytearray(b"")},
        {"name": bytearray(b"explain"), "value": bytearray(b"True")},
        {"name": bytearray(b"Content-Type"), "value": bytearray(b"image/png")},
    ]
    assert msg["parameters"] == [{"name": "body", "contentType": "image/png", "value": bytearray(b"\x01")}]
    (plain,) = batch(Request.from_bytes(b"x")).to_worker_message()
    assert plain["parameters"][0]["contentType"] == ""


def test_encode_frame_layout():
    req = Request((Parameter("body", b"ab", "t"),), {"h": "v"}, "id")

    def field(b: bytes) -> bytes:
        return struct.pack("!i", len(b)) + b

    end = struct.pack("!i", -1)
    frontend = field(b"url_path") + field(b"") + field(b"explain") + field(b"False")
    headers = frontend + field(b"h") + field(b"v") + end
    params = field(b"body") + field(b"t") + field(b"ab") + end
    expected = b"I" + field(b"id") + headers + params + end
    assert batch(req).encode() == expected
    no_type = Request((Parameter("body", b"", None),), {}, "id")
    empty_body = field(b"body") + field(b"") + field(b"") + end
    assert batch(no_type).encode() == b"I" + field(b"id") + frontend + end + empty_body + end
    routed = Request((Parameter("body", b"", None),), {}, "id", url_path="v1/chat")
    assert field(b"url_path") + field(b"v1/chat") in batch(routed).encode()


# --------------------------------------------------------------------------------------------
# Raw data lists: handle([[1.0, 2.0]], ctx), as TorchServe's own unit tests call it
# --------------------------------------------------------------------------------------------


def test_a_list_of_plain_rows_is_delivered_as_it_is():
    rows = [[1.0, 2.0], [4.0, 3.0]]
    bt = Batch.coerce(rows)
    assert bt.data == rows
    data = bt.data
    data[0].append(9.0)
    assert rows == [[1.0, 2.0], [4.0, 3.0]] and bt.data == rows  # copies, every time
    assert bt.headers == [{}, {}]  # the worker never builds such items: no frontend, no headers
    assert len(set(bt.request_ids.values())) == 2
    ctx = MockContext()
    bt.bind(ctx)
    assert ctx.get_all_request_header(0) == {}
    assert ctx.get_request_header(0, "explain") is None
    assert len(ctx.request_ids) == 2
    assert "Batch(2 requests: [item list]; [item list]" in repr(bt)


def test_batch_args_are_items_like_handles_data():
    assert batch([1.0, 2.0]).data == [[1.0, 2.0]]  # handle([[1.0, 2.0]], ctx)
    assert batch([1.0, 2.0], [3.0, 4.0]).data == [[1.0, 2.0], [3.0, 4.0]]


def test_every_kind_of_item_in_one_batch():
    import torch

    t = torch.arange(4.0)
    req = Request.text("a", request_id="r")
    bt = Batch.coerce([req, {"data": "b"}, [1.0], "raw str", b"raw bytes", t, None, (1, 2)])
    data = bt.data
    assert data[:5] == [{"body": "a"}, {"data": "b"}, [1.0], "raw str", b"raw bytes"]
    assert torch.equal(data[5], t) and data[5] is not t
    assert data[6] is None and data[7] == (1, 2)
    headers = bt.headers
    assert headers[0]["explain"] == "False" and headers[1]["data"] == {"content-type": "text/plain"}
    assert headers[2:] == [{}] * 6
    assert bt.request_ids[0] == "r"
    # slicing and split keep the items and their ids
    assert bt[2:4].data == [[1.0], "raw str"] and bt[2:4].request_ids == {0: bt.request_ids[2], 1: bt.request_ids[3]}
    assert [p.data for p in bt.split()][7] == [(1, 2)]


def test_raw_items_cannot_go_on_the_wire():
    bt = batch(Request.text("a"), [1.0, 2.0])
    expected = r"request 1 cannot go on the wire: it is a raw list item \(the unit-test path\).*Request\.json"
    with pytest.raises(TypeError, match=expected):
        bt.encode()
    with pytest.raises(TypeError, match=expected):
        bt.to_worker_message()
    assert len(bt[:1].encode()) > 0


def test_lists_of_requests_are_refused_with_the_fix():
    a, b = Request.text("a"), Request.text("b")
    with pytest.raises(TypeError, match=r"item 0 is a list holding Requests; .*batch\(\*requests\)"):
        Batch.coerce([[a, b]])
    with pytest.raises(TypeError, match=r"item 0 is a list of 2 requests/dicts; .*Batch.coerce\(requests\).*Request.from_item"):
        batch([{"data": 1}, {"data": 2}])
    with pytest.raises(TypeError, match=r"item 1 is a tuple of 1 requests/dicts"):
        batch(a, (b,))
    # A list of dicts as one item, when that is what the handler takes: say so.
    assert batch(Request.from_item([{"data": 1}])).data == [[{"data": 1}]]
    assert Batch.coerce([[{"data": 1}]]).data == [[{"data": 1}]]  # explicit nesting is an item


@pytest.mark.parametrize(
    "value, what, fix",
    [
        ("tensor", "a Tensor", r"pass a list: \[x\] \(each item goes to the handler as it is\)"),
        ("text", "a str", r"pass a list: \[x\], or hk\.batch\(hk\.Request\.text\(x\)\)"),
        (b"png", "bytes", r"pass a list: \[x\], or hk\.batch\(hk\.Request\.from_bytes\(x\)\)"),
        (None, "None", r"pass a list of requests: \[hk\.Request\.json\(x\)\]"),
        ("requests", "a dict of 2 Requests", r"pass them as a list: list\(x\.values\(\)\)$"),
        (3.5, "a float", r"pass a list: \[x\]"),
    ],
    ids=["tensor", "str", "bytes", "None", "dict-of-requests", "float"],
)
def test_what_is_not_a_batch_is_refused_with_the_fix(value, what, fix):
    import torch

    if value == "tensor":
        value = torch.tensor([[1.0, 2.0]])
    if value == "requests":
        value = {"a": Request.json(1), "b": Request.json(2)}
    expected = rf"expected a batch: a list as handle\(data, context\) takes it, a Batch or a Request: got {what}; {fix}"
    with pytest.raises(TypeError, match=expected):
        Batch.coerce(value)


def test_one_request_dict_is_still_a_batch_of_one():
    assert Batch.coerce({"data": b"x"}).data == [{"data": b"x"}]
    assert Batch.coerce({"data": b"x", "meta": {"k": 1}}).data == [{"data": b"x", "meta": {"k": 1}}]
    assert Batch.coerce([{"data": {"k": 1}}]).data == [{"data": {"k": 1}}]


def test_a_request_dict_with_dict_values_is_one_request():
    # What the worker builds for a JSON body: {"body": <parsed dict>}. Dict values are a
    # request's parameters, never requests: only Requests make a dict of requests.
    for row in ({"body": {"instances": [1, 2]}}, {"data": {"x": 1}}, {"a": {"data": 1}, "b": {"data": 2}}):
        bt = Batch.coerce(row)
        assert len(bt) == 1 and bt.data == [row]
    assert Batch.coerce({"body": {"instances": [1, 2]}}).headers[0]["body"] == {"content-type": "application/json"}
    with pytest.raises(TypeError, match=r"got a dict of 1 Requests; pass them as a list"):
        Batch.coerce({"r": Request.json({"x": 1})})


@pytest.mark.parametrize("item", [{1: "x"}, {"": b"x"}, {"ok": 1, 2: "y"}])
def test_dicts_without_parameter_names_are_raw_items(item):
    # TorchServe's unit tests pass such dicts straight to handle(): delivered as they are.
    for bt in (batch(item), Batch.coerce(item), Batch.coerce([item])):
        assert bt.data == [item] and bt[0].item and bt.headers == [{}]
    with pytest.raises(TypeError, match=r"Request\.from_data needs parameter names \(non-empty str\) as keys: got 1; .*Request\.from_item\(x\)"):
        Request.from_data({1: "x"})


# -- implicit binding: handle(data, ctx) called directly on a MockContext nobody bound -----------


def test_bind_implicitly_binds_an_unbound_mock_context_and_replaces_its_own_batch():
    ctx = MockContext()
    assert batches.bind_implicitly(ctx, [[1.0, 2.0], {"body": {"a": 1}}]) is True
    assert ctx.implicit_batch is True and len(ctx.request_processor) == 2
    assert ctx.get_all_request_header(0) == {}  # a raw item: no frontend, no headers
    assert ctx.get_request_header(1, "body") == {"content-type": "application/json"}
    assert ctx.get_request_header(1, "explain") == "False"  # a request dict: as the worker delivers it
    assert ctx.metrics.request_ids == ctx.request_ids
    first = dict(ctx.request_ids)
    assert batches.bind_implicitly(ctx, [[3.0, 4.0]]) is True  # its own batch: the next call's replaces it
    assert len(ctx.request_processor) == 1 and ctx.request_ids[0] not in first.values()


def test_bind_implicitly_leaves_every_other_binding_and_context_alone():
    ctx = MockContext()
    batch(Request.json({"a": 1}, headers={"explain": "True"}, request_id="r0")).bind(ctx)
    assert batches.bind_implicitly(ctx, [[1.0], [2.0]]) is False
    assert ctx.request_ids == {0: "r0"} and ctx.get_request_header(0, "explain") == "True"

    unbound = MockContext()
    for not_a_batch in (None, []):
        assert batches.bind_implicitly(unbound, not_a_batch) is False
    assert unbound.request_processor is None and unbound.implicit_batch is False

    class TheirTestMock:  # TorchServe's test MockContext: no request slots, nothing to bind to
        explain = False

    assert batches.bind_implicitly(TheirTestMock(), [[1.0]]) is False and not hasattr(TheirTestMock(), "request_ids")


def test_bind_implicitly_goes_by_the_contexts_state_not_its_type():
    class TheirContext:  # TorchServe's Context: None until its worker binds a batch, before every handle
        def __init__(self):
            self.request_processor = None

        def __eq__(self, other):  # as ts.context.Context: so it cannot be hashed
            return self is other

    theirs = TheirContext()
    assert batches.bind_implicitly(theirs, [[1.0], [2.0]]) is True  # so unbound, handle was called directly
    assert len(theirs.request_processor) == 2 and theirs.implicit_batch
    assert batches.bind_implicitly(theirs, [[3.0]]) is True and len(theirs.request_processor) == 1  # its own: replaced
    batch(Request.json({"a": 1}, request_id="w0")).bind(theirs)  # as the worker binds (its setter resets nothing)
    assert batches.bind_implicitly(theirs, [[4.0], [5.0]]) is False and theirs.request_ids == {0: "w0"}
