"""Tests of the {{name}} handler, with handlerkit's pytest plugin: `pytest` in this folder.

pytest.ini names the model dir (hk_model_dir = model); hk_harness() loads its handler as
TorchServe's worker would, and hk_request reads requests from files next to this one. A
failure names the stage, the request and the fix; a request the handler cannot read is
answered alone, with its own 400.
"""

import pytest

import handlerkit as hk
from handlerkit.testing import assert_batch_parity, assert_contract

REQUESTS = {{requests}}
LABELS = {{labels}}


def test_each_request_gets_its_label(hk_harness, hk_request):
    run = assert_contract(hk_harness(), hk_request.batch(*REQUESTS))  # what TorchServe would refuse
    assert [answer["label"] for answer in run.output] == LABELS


def test_a_request_alone_gets_what_it_gets_in_a_batch(hk_harness, hk_request):
    assert_batch_parity(hk_harness(), hk_request.batch(*REQUESTS))


def test_preprocess_gives_one_row_per_request(hk_harness, hk_request):
    h = hk_harness()
    h.initialize()
    pre = h.preprocess(hk_request.batch(*REQUESTS))
    assert pre.tensors[0].shape[0] == len(REQUESTS)


def test_a_request_it_cannot_read_is_answered_alone(hk_harness, hk_request):
    h = hk_harness()
    garbage = hk.Request.from_bytes(b"\xff\x00\xfe", "application/octet-stream")
    run = assert_contract(h, hk_request.batch(*REQUESTS, garbage))
    assert [answer["label"] for answer in run.output[:-1]] == LABELS  # the others are answered
    refused = run.output[-1]  # the handler's self.refuse(...): its own answer and status
    assert refused["code"] == 400 and refused["error"].startswith("expected ")
    assert refused["fix"].startswith("send ")  # what the client should send instead
    assert h.context.get_response_status(len(REQUESTS)) == (400, "Bad Request")  # that client alone
