"""handlerkit/recording/failures.py: fixes that fit what the client sent. A form without a field
the handler reads; a request that fails preprocess alone where another passes (its payload is
what the handler cannot read); a batch whose requests each pass alone (what they sent does not
go together). The rest of the module is tested through the recorder in test_recording.py."""

from __future__ import annotations

import pytest

import handlerkit as hk
from handlerkit.errors import StageError


class Stages:
    def initialize(self, context):
        pass

    def inference(self, x):
        return x

    def postprocess(self, y):
        return [str(v) for v in y]

    def handle(self, data, context):
        return self.postprocess(self.inference(self.preprocess(data)))


class Loan(Stages):
    """Reads three named form fields."""

    def preprocess(self, data):
        return [(float(row["age"]), float(row["income"]), row["city"].decode()) for row in data]


class Numbers(Stages):
    """Reads ``{"x": number}`` and stacks the numbers of a batch into one list."""

    def preprocess(self, data):
        return [float(row["body"]["x"]) for row in data]


class Rows(Stages):
    """Reads ``{"row": [numbers]}`` and needs every row of a batch to be as long as the first."""

    def preprocess(self, data):
        rows = [row["body"]["row"] for row in data]
        if any(len(r) != len(rows[0]) for r in rows):
            raise ValueError(f"expected rows of {len(rows[0])} values")
        return rows


def harness(cls: type) -> hk.Harness:
    return hk.Harness(cls, hk.MockContext(gpu_id=None))


def test_a_form_without_a_field_the_handler_reads_is_told_as_the_clients_form():
    h = harness(Loan)
    full = hk.Request.form({"age": "35", "income": "52", "city": "lyon"})
    misspelt = hk.Request.form({"age": "61", "income": "20", "cty": "nice"})
    with pytest.raises(StageError, match=r"preprocess failed in Loan for request 1: KeyError: 'city'") as info:
        h.run([full, misspelt])
    assert info.value.request_index == 1
    assert info.value.fix == (
        "the client's form lacks the field 'city' (did you mean 'cty'?): request 1 sent the fields 'age', "
        "'income', 'cty'. Send 'city' as a form field, or validate it in preprocess and refuse that request alone "
        "(self.refuse(index, message, fix=...), see handlerkit.handlers.PerRequestErrors), so the client gets a 400 "
        "that says what to send"
    )


def test_a_form_of_data_alone_is_told_as_torchserves_layout_not_as_a_missing_field():
    h = harness(Loan)
    with pytest.raises(StageError, match=r"for request 0: KeyError: 'age'") as info:
        h.run([hk.Request.form({"data": "age=35&income=52&city=lyon"})])  # everything in the one 'data' field
    assert info.value.fix.startswith("request 0 has no parameter 'age' (it has 'data'): TorchServe puts a raw body")


def test_a_request_that_fails_alone_where_another_passes_is_told_its_payload_is_at_fault():
    h = harness(Numbers)
    batch = hk.batch(hk.Request.json({"x": 1}), hk.Request.json({"x": "one"}), hk.Request.json({"x": 3}))
    with pytest.raises(StageError, match=r"for request 1: ValueError: could not convert string to float") as info:
        h.run(batch)
    assert info.value.request_index == 1
    assert info.value.fix.startswith(
        "request 1 fails preprocess alone where request 0 passes, so what it sent is what the handler cannot read: "
        "compare its payload with request 0's; validate it in preprocess and refuse that request alone "
        "(self.refuse(index, message, fix=...), see handlerkit.handlers.PerRequestErrors), "
        "or correct test_failures.py line "
    )
    h.request_names = {batch[0].request_id: "one.json", batch[1].request_id: "two.json"}
    with pytest.raises(StageError, match=r"for two\.json: ValueError") as info:
        h.run(batch)
    assert info.value.fix.startswith("two.json fails preprocess alone where one.json passes")


def test_a_usual_cause_keeps_its_own_fix_and_requests_that_all_fail_get_the_line():
    h = harness(Numbers)
    with pytest.raises(StageError, match=r"for request 1: KeyError: 'x'") as info:
        h.run([hk.Request.json({"x": 1}), hk.Request.json({"y": 2})])
    assert info.value.fix.startswith("the client's payload lacks the key 'x'")
    with pytest.raises(StageError, match=r"for the batch: ValueError") as info:
        h.run([hk.Request.json({"x": "one"}), hk.Request.json({"x": "two"})])  # none passes: no payload to compare
    assert info.value.request_index is None
    assert "\n  run alone, each of the 2 requests fails too: no one request is at fault\n" in str(info.value)
    assert info.value.fix.startswith("ValueError was raised at test_failures.py line ")


def test_a_batch_whose_requests_each_pass_alone_is_told_what_they_sent_does_not_go_together():
    h = harness(Rows)
    batch = hk.batch(hk.Request.json({"row": [1, 2, 3, 4]}), hk.Request.json({"row": [1, 2, 3]}))
    assert h.run(batch[1:]).output == ["[1, 2, 3]"]
    with pytest.raises(StageError, match=r"preprocess failed in Rows for the batch: ValueError: expected rows") as info:
        h.run(batch)
    assert info.value.request_index is None
    assert info.value.fix.startswith(
        "each of the 2 requests passes preprocess alone, so it is their combination that fails: what they sent "
        "differs where the handler puts them together (lists of different lengths, images of different sizes); "
        "compare their payloads, and where one has the wrong size, validate it in preprocess and refuse that "
        "request alone (self.refuse(index, message, fix=...), see handlerkit.handlers.PerRequestErrors), "
        "or make test_failures.py line "
    )
    assert info.value.fix.endswith(" pad them")
