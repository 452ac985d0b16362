"""h.check on inputs beyond image requests: raw items, several form fields, and a config edited
in place between two initializes (the harness takes the edit)."""

from __future__ import annotations

import re

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


# ---------------------------------------------------------------------------- the recompile gate
def test_check_includes_the_recompile_gate_for_a_compiled_model(tmp_path, request):
    from conftest import MLP_MODEL_PY, eager_manifest, write_model_dir

    # The test's id in the source: Dynamo remembers sizes per file content across models.
    model_dir = write_model_dir(tmp_path / "mlp", f"{MLP_MODEL_PY}\n# {request.node.nodeid}\n")
    config = {"batchSize": 4, "pt2": {"compile": {"enable": True, "backend": "eager"}}}
    ctx = hk.MockContext(model_dir=model_dir, gpu_id=None, manifest=eager_manifest(), model_yaml_config=config)
    report = hk.Harness(hk.BaseHandler, ctx).check([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]])
    [problem] = [p for p in report.problems if p.check == "recompile"]
    assert problem.severity == "warning" and "batch size 1, 4" in problem.message
    assert "dynamic: true" in problem.fix
    assert report.ok  # a warning, not a broken contract
    assert "recompile gate: batch sizes 1, 2, 4 replayed under fail_on_recompile" in report.notes


def test_check_of_an_uncompiled_handler_runs_no_gate(monkeypatch):
    import pytest

    from handlerkit.diagnostics.compile import gate as _compile_gate

    monkeypatch.setattr(_compile_gate, "run_gate", lambda *args, **kwargs: pytest.fail("the gate ran"))
    report = hk.Harness(Sum(), hk.MockContext(gpu_id=None)).check([[1.0, 2.0], [3.0]])
    assert report.ok and not any("recompile" in n for n in report.notes)


# ---------------------------------------------------------------------------- the set-up
def test_check_initializes_first_and_keeps_that_initialize():
    h = hk.Harness(Sum(), hk.MockContext(gpu_id=None))
    h.check([[1.0, 2.0], [3.0]])
    assert list(h.results) == ["initialize"] and h.results["initialize"].ok  # the runs' results are gone


def test_a_handler_that_cannot_initialize_is_one_problem():
    class Broken(Sum):
        def initialize(self, context):
            raise ValueError("no weights here")

    h = hk.Harness(Broken(), hk.MockContext(gpu_id=None))
    report = h.check([[1.0]])
    [problem] = report.problems
    assert (problem.check, problem.stage) == ("runs", "initialize")
    assert "ValueError: no weights here" in problem.message
    assert not report.ok and not h.results["initialize"].ok and h.track_memory


def test_a_status_that_is_no_http_code_is_a_problem():
    class Teapot(Sum):
        def handle(self, data, context):
            context.set_response_status(1000, "Way Too Much", 0)
            return super().handle(data, context)

    report = hk.Harness(Teapot(), hk.MockContext(gpu_id=None)).check([[1.0]])
    [problem] = [p for p in report.problems if p.check == "status"]
    assert problem.request_index == 0 and problem.message == "response status 1000 is not an HTTP status code"
    assert report.statuses == [(1000, "Way Too Much")]


def test_same_output_stays_importable_from_checks():
    from handlerkit._compare import same_output as owner
    from handlerkit.diagnostics.checks import same_output

    assert same_output is owner


# ---------------------------------------------------------------------------- each row its request
def _validating_audio_dir(path):
    """The audio model dir of a user who validates the payload in preprocess, naming the request
    by its index in the batch the handler got, as handlerkit's templates do."""
    from _new_users import audio_dir

    model_dir = audio_dir(path)
    handler = model_dir / "handler.py"
    source = handler.read_text()
    for old, new in [
        ("import torch\n", "import torch\nfrom handlerkit.errors import RequestError\n"),
        (
            '        for row in data:\n            body = row.get("data") or row.get("body")\n',
            '        for index, row in enumerate(data):\n            body = row.get("data") or row.get("body")\n'
            "            if not isinstance(body, (bytes, bytearray)):\n"
            '                raise RequestError(f"request {index}: expected WAV bytes, got {type(body).__name__}", '
            'index, fix="send the WAV file as the body")\n',
        ),
    ]:
        assert old in source
        source = source.replace(old, new, 1)
    handler.write_text(source)
    return model_dir


def test_each_row_of_the_encodings_table_names_its_own_request(tmp_path):
    from _new_users import wav_bytes

    h = hk.Harness.open(_validating_audio_dir(tmp_path / "sounds"))
    wavs = hk.batch(*(hk.Request.from_bytes(wav_bytes(f), "audio/wav") for f in (300.0, 440.0, 1000.0, None)))
    report = h.check(wavs, progress=False)
    refused = [(i, outcome) for i, variant, outcome in report.encodings if variant == "base64 str (JSON clients)"]
    # Each request is re-sent alone, where the handler calls it request 0: the table says which it is.
    assert refused == [(i, f"refused clearly: request {i}: expected WAV bytes, got str") for i in range(4)]
    named = {(i, int(n)) for i, _, outcome in report.encodings for n in re.findall(r"request (\d+)", outcome)}
    assert named == {(i, i) for i in range(4)}
