"""h.check on inputs beyond image requests: raw items, several form fields, and a config edited
in place between two initializes (the harness takes the edit)."""

from __future__ import annotations

import handlerkit as hk


class Sum:
    def initialize(self, context):
        self.scale = (context.model_yaml_config.get("handler") or {}).get("scale", 1)

    def handle(self, data, context):
        out = []
        for row in data:
            if isinstance(row, dict):
                body = row.get("data") or row.get("body")
                if isinstance(body, (bytes, bytearray)):
                    body = body.decode()
                out.append({"sum": float(sum(map(float, str(body).split(",")))) * self.scale, "tag": str(row.get("tag"))})
            else:
                out.append({"sum": float(sum(row)) * self.scale})
        return out


def test_check_takes_raw_items_as_handle_does():
    report = hk.Harness(Sum(), hk.MockContext(gpu_id=None)).check([[1.0, 2.0], [3.0]])
    assert report.ok and report.encodings == []
    assert report.parity == [(0, "same alone and in the batch"), (1, "same alone and in the batch")]


def test_other_encodings_keep_the_requests_other_fields():
    form = hk.Request.form({"data": "1,2", "tag": "x"})
    report = hk.Harness(Sum(), hk.MockContext(gpu_id=None)).check(hk.batch(form))
    assert report.ok
    outcomes = dict((variant, outcome) for _, variant, outcome in report.encodings)
    assert outcomes["field 'body' instead of 'data'"] == "same output"  # the tag field went along
    assert outcomes["bytes instead of bytearray"] == "same output"


def test_a_config_edited_in_place_reaches_the_next_initialize():
    ctx = hk.MockContext(gpu_id=None, model_yaml_config={"handler": {"scale": 2}})
    h = hk.Harness(Sum, ctx)
    h.initialize()
    assert h.run([[1.0]]).output == [{"sum": 2.0}]
    h.context.model_yaml_config["handler"]["scale"] = 10  # an edit in place, not a new dict
    h.initialize()
    assert h.run([[1.0]]).output == [{"sum": 10.0}]
    h.initialize()  # and it stays
    assert h.handler.scale == 10
