"""The client's side of a service envelope (``handlerkit.worker.clients``): what it refuses to build
and read. Its requests round-trip through TorchServe's envelopes and ours in
tests/worker/test_envelopes.py ("client builders")."""

from __future__ import annotations

import pytest

from handlerkit.errors import HandlerkitError
from handlerkit.worker.clients import request, unwrap_response


def test_a_v2_request_infers_what_a_client_leaves_out():
    body = request("kservev2", [[1.5, 2.0]], id="r").data()["body"]
    assert body == {"id": "r", "inputs": [{"name": "input-0", "shape": [1, 2], "datatype": "FP64", "data": [1.5, 2.0]}]}
    assert request("kservev2", inputs=[{"name": "x", "data": [1, 2], "datatype": "INT32"}]).data()["body"]["inputs"] == [
        {"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2]}
    ]


def test_a_response_is_unwrapped_from_its_item_or_its_http_body():
    assert unwrap_response("json", {"predictions": [1, 2]}) == [1, 2]
    assert unwrap_response("kserve", b'{"explanations": [3]}') == [3]
    assert unwrap_response("kservev2", '{"outputs": [{"name": "y", "data": [0.5]}]}') == {"y": [0.5]}
    assert unwrap_response("body", b"raw") == b"raw"


def test_builder_errors():
    with pytest.raises(ValueError, match=r"rows have shapes \[\[2\], \[1\]\]"):
        request("kservev2", [[1, 2], [3]])
    with pytest.raises(ValueError, match=r"cannot infer the datatype of input 'input-0': pass 'datatype'"):
        request("kservev2", [1, "a"])
    with pytest.raises(TypeError, match="instances \\(one input\\) or inputs, not both"):
        request("kservev2", [1], inputs={"a": [1]})
    with pytest.raises(ValueError, match="needs a non-empty list of instances"):
        request("json", [])
    with pytest.raises(TypeError, match="inputs and id are for kservev2 requests, not kserve"):
        request("kserve", [1], id="x")
    with pytest.raises(ValueError, match="the body envelope passes any request through"):
        request("body", [1])
    with pytest.raises(HandlerkitError, match=r"did you mean 'kservev2'"):
        request("kservev", [1])
    with pytest.raises(HandlerkitError, match=r"not a kservev2 response item: \{'predictions'"):
        unwrap_response("kservev2", {"predictions": [1]})


