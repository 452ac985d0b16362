"""The fix of a stage's failure (:mod:`handlerkit.recording.fixes`), told apart by what the client
sent: an error's own fix, the usual ways a stage fails, a key the payload lacks, an input at fault."""

from __future__ import annotations

import json

import pytest
import torch

from handlerkit.errors import HandlerkitError
from handlerkit.recording.alone import Alone
from handlerkit.recording.fixes import REFUSE_ALONE, input_fix, missing_key_fix, payload_fix, suggest_fix, together_fix

HANDLER = ("/models/recs/handler.py", 12, "ids = json.loads(body)")
ONE_AT_FAULT = Alone(failing=1, passing=0, tried=2)


def test_an_errors_own_fix_comes_first_then_its_causes_then_the_table():
    assert suggest_fix("preprocess", HandlerkitError("bad image", fix="send a PNG")) == "send a PNG"
    with pytest.raises(ValueError) as info:
        try:
            raise HandlerkitError("no weights", fix="put model.pt in the dir")
        except HandlerkitError as exc:
            raise ValueError("initialize failed") from exc
    assert suggest_fix("initialize", info.value) == "put model.pt in the dir"
    assert suggest_fix("inference", RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")) == (
        "the preprocessed tensor's shape does not fit the model: compare h.results['preprocess'].tensors with the "
        "model's expected input"
    )
    assert suggest_fix("preprocess", KeyError("data")).startswith("a dict lacks the key the handler reads")
    assert suggest_fix("inference", KeyError("data")) is None  # a KeyError's entry is for the stages that read requests
    assert suggest_fix("initialize", ValueError("?")) == "check the model dir, manifest and model-config.yaml the context points at"
    assert suggest_fix("postprocess", ValueError("?")) is None


def test_a_key_the_clients_payload_lacks_is_told_from_torchserves_layout():
    payload = missing_key_fix(KeyError("feature"), [{"body": {"features": [1.0]}}], 0, {0: "a.json"})
    assert payload == (
        "the client's payload lacks the key 'feature' (did you mean 'features'?): a.json sent a JSON object with "
        f"'features'. Send 'feature' in the request, or validate it in preprocess and {REFUSE_ALONE}, so the client "
        "gets a 400 that says what to send"
    )
    form = missing_key_fix(KeyError("age"), [{"name": b"ada", "city": b"london"}], None)
    assert form == (
        "the client's form lacks the field 'age': request 0 sent the fields 'name', 'city'. Send 'age' as a form "
        f"field, or validate it in preprocess and {REFUSE_ALONE}, so the client gets a 400 that says what to send"
    )
    assert missing_key_fix(KeyError("data"), [{"body": b"raw"}], 0) == (
        "request 0 has no parameter 'data' (it has 'body'): TorchServe puts a raw body under 'body' and form "
        "fields under their names; read the payload with row.get('data') or row.get('body')"
    )


def test_a_key_of_the_handlers_own_or_no_key_at_all_gets_no_payload_fix():
    assert missing_key_fix(KeyError("cat"), [{"body": {"label": "cat"}}], 0) == ""  # a value the client sent
    assert missing_key_fix(KeyError("3"), [{"body": b"raw"}], 0) == ""  # a class index
    assert missing_key_fix(KeyError("no such label here"), [{"body": {}}], 0) is None  # a sentence
    assert missing_key_fix(ValueError("x"), [{"body": {}}], 0) is None


def test_one_request_or_the_combination_at_fault_names_the_handlers_line():
    assert payload_fix("request 1", "request 0", "preprocess", HANDLER, shape=False) == (
        "request 1 fails preprocess alone where request 0 passes, so what it sent is what the handler cannot read: "
        f"compare its payload with request 0's; validate it in preprocess and {REFUSE_ALONE}, or correct handler.py "
        "line 12 if it should be read"
    )
    assert together_fix(2, "handle", HANDLER).startswith(
        "each of the 2 requests passes alone, so it is their combination that fails: "
    )
    assert together_fix(2, "handle", HANDLER).endswith(f"{REFUSE_ALONE}, or make handler.py line 12 pad them")


def test_bytes_that_do_not_decode_or_an_index_the_embedding_lacks_blame_the_input():
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads("not json")
    assert input_fix("preprocess", info.value, "request 1", "request 0", ONE_AT_FAULT, [HANDLER]) == (
        "request 1's bytes do not decode (JSONDecodeError at handler.py line 12): the client sent a truncated or "
        f"malformed payload. A handler cannot trust what clients send: validate it in preprocess and {REFUSE_ALONE}"
    )
    with pytest.raises(IndexError) as info:
        torch.nn.functional.embedding(torch.tensor([[1, 7]]), torch.zeros(5, 2))
    assert input_fix("inference", info.value, "request 1", "request 0", ONE_AT_FAULT, []) == (
        f"request 1 sent the index 7, which the embedding has no row for (it has 5, 0 to 4): validate it in "
        f"preprocess and {REFUSE_ALONE}"
    )
    assert input_fix("inference", info.value, None, None, Alone(failing=0, tried=3), []).startswith(
        "each request run alone gives the index 7 or another that the embedding has no row for"
    )
    both_pass = Alone(failing=None, passing=0, tried=2)  # only their combination fails: no input is at fault
    assert input_fix("preprocess", info.value, "request 1", "request 0", both_pass, []) is None
    assert input_fix("postprocess", ValueError("?"), "request 1", "request 0", ONE_AT_FAULT, []) is None
