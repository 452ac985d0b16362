"""handlerkit.testing: the assertions a handler's own test suite calls, and the requests it builds
from files. Each failure lists every problem with its stage, the request (by the file it came
from) and the fix; as a user's CI meets them (a real pytest in a subprocess), the traceback
points at the user's line. The plugin that runs them is tested in test_pytest_plugin.py.
"""

from __future__ import annotations

import json
import math
import random
import re
import warnings
from pathlib import Path

import pytest
import torch
from _user_suites import IMAGES, MODEL, TRUNCATED, run_pytest, write_ini

import handlerkit as hk
from handlerkit import testing
from handlerkit.errors import HandlerkitWarning, RequestError
from handlerkit.testing import RequestFiles, assert_batch_parity, assert_contract, assert_matches_golden

pytest_plugins = ["pytester"]


def lengths(data, context):
    """A function handler: each request's body length (TorchServe initialises it with data=None)."""
    return None if data is None else [len(row["body"]) for row in data]


def tensors(data, context):
    return None if data is None else [torch.zeros(1) for _ in data]


def batch_sized(data, context):
    return None if data is None else [len(data)] * len(data)  # depends on the other requests


def noisy(data, context):
    return None if data is None else [random.random() for _ in data]


class Picky:
    """Refuses an empty body with a RequestError naming the request."""

    def initialize(self, context):
        pass

    def preprocess(self, data):
        for i, row in enumerate(data):
            if not row["body"]:
                raise RequestError("empty body", i, fix="send some bytes")
        return data

    def inference(self, data):
        return data

    def postprocess(self, data):
        return [len(row["body"]) for row in data]

    def handle(self, data, context):
        return self.postprocess(self.inference(self.preprocess(data)))


@pytest.fixture
def files(tmp_path: Path) -> RequestFiles:
    (tmp_path / "abc.txt").write_text("abc")
    (tmp_path / "empty.bin").write_bytes(b"")
    return RequestFiles(tmp_path)


# ---------------------------------------------------------------------------- assert_contract
def test_a_handler_that_keeps_the_contract_passes_and_returns_its_run(files):
    run = assert_contract(hk.Harness(lengths, hk.MockContext()), files.batch("abc.txt", hk.Request.text("xy")))
    assert run.output == [3, 2] and run.batch_size == 2


def test_a_stage_error_names_the_stage_the_request_by_its_file_and_the_fix(files):
    with pytest.raises(AssertionError) as caught:
        assert_contract(hk.Harness(Picky, hk.MockContext()), files.batch("abc.txt", "empty.bin"))
    assert str(caught.value).splitlines() == [
        "Picky failed on a batch of 2 request(s):",
        "  1. preprocess, request 1 (empty.bin): RequestError: empty body",
        "     fix: send some bytes",
    ]


def test_warning_level_findings_warn_at_the_callers_line_and_fail_only_when_strict():
    h = hk.Harness(tensors, hk.MockContext())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_contract(h, [{"body": b"x"}])
    (warning,) = [w for w in caught if issubclass(w.category, HandlerkitWarning)]
    assert str(warning.message).startswith("handlerkit: handle: request 0: the item is a Tensor")
    assert warning.filename == __file__
    with pytest.raises(AssertionError, match=r"tensors broke TorchServe's contract on a batch of 1 request\(s\): 1 problem") as info:
        assert_contract(h, [{"body": b"x"}], strict=True)
    assert "     fix: convert it with .tolist() (or .item() for a scalar)" in str(info.value).splitlines()


# ---------------------------------------------------------------------------- assert_batch_parity
def test_batch_parity_passes_for_independent_requests_and_needs_two(files):
    h = hk.Harness(lengths, hk.MockContext())
    report = assert_batch_parity(h, files.batch("abc.txt", "abc.txt"))
    assert [verdict for _, verdict in report.parity] == ["same alone and in the batch"] * 2
    with pytest.raises(ValueError, match=r"batch parity compares requests alone with a batch of several: got 1 request"):
        assert_batch_parity(h, [{"body": b"x"}])


def test_batch_parity_fails_on_requests_that_depend_on_each_other(files):
    with pytest.raises(AssertionError) as caught:
        assert_batch_parity(hk.Harness(batch_sized, hk.MockContext()), files.batch("abc.txt", "empty.bin"))
    lines = str(caught.value).splitlines()
    assert lines[0] == "batch_sized answers 2 request(s) differently alone than in a batch of 2 (atol=0.0001, rtol=0.0001):"
    assert lines[1].startswith("  1. handle, request 0 (abc.txt): alone gives")
    assert any(line.startswith("     fix: keep requests independent") for line in lines)


def test_batch_parity_that_cannot_be_judged_fails_saying_why(files):
    with pytest.raises(AssertionError, match=r"^batch parity of noisy cannot be judged:\n  cannot judge"):
        assert_batch_parity(hk.Harness(noisy, hk.MockContext()), files.batch("abc.txt", "abc.txt"))
    with pytest.raises(AssertionError, match=r"^Picky failed on a batch of 2 request\(s\), so parity cannot be judged:"):
        assert_batch_parity(hk.Harness(Picky, hk.MockContext()), files.batch("abc.txt", "empty.bin"))


# ---------------------------------------------------------------------------- RequestFiles
def test_request_files_are_found_relative_to_their_base_and_named_by_their_path(files, tmp_path):
    assert files.path("abc.txt") == tmp_path / "abc.txt" and files.path("/etc/hosts") == Path("/etc/hosts")
    request = files.file("abc.txt")
    assert testing._origins[request.request_id] == "abc.txt"
    assert testing._origins[files.file(tmp_path / "abc.txt").request_id] == "abc.txt"  # absolute: its name
    expected = f"no such file: {tmp_path / 'nope.png'} ('nope.png' is taken relative to {tmp_path})"
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        files.file("nope.png")
    form = files.form({"data": Path("abc.txt"), "meta": (Path("abc.txt"), "text/plain"), "note": "plain"})
    assert [(p.name, bytes(p.value), p.content_type) for p in form.parameters] == [
        ("data", b"abc", "text/plain"), ("meta", b"abc", "text/plain"), ("note", b"plain", None)]
    assert files.json({"a": 1}).data() == {"body": {"a": 1}} and files.text("t").data() == {"body": "t"}
    batch = files.batch("abc.txt", hk.Request.text("xy"), decode=False)
    assert len(batch) == 2 and batch.decode is False and batch.data[0] == {"body": bytearray(b"abc")}
    assert repr(files) == f"RequestFiles(base={str(tmp_path)!r})"


# ---------------------------------------------------------------------------- golden files, directly
def test_golden_files_compare_with_tolerance_and_regenerate_on_request(tmp_path: Path):
    golden = tmp_path / "sub" / "out.json"
    with pytest.raises(AssertionError, match=r"no golden file at .*out\.json:\n  run pytest with --hk-regen once"):
        assert_matches_golden([{"a": 1.0}], golden)
    assert_matches_golden([{"a": 1.0, "b": [1, 2]}], golden, regen=True)
    assert json.loads(golden.read_text()) == [{"a": 1.0, "b": [1, 2]}]
    assert_matches_golden([{"b": (1, 2), "a": 1.00001}], golden)  # key order, tuples, atol
    with pytest.raises(AssertionError) as caught:
        assert_matches_golden([{"a": 2.0, "c": 3}], golden)
    message = str(caught.value)
    assert "output[0]: missing key(s) ['b']" in message and "output[0]: new key(s) ['c']" in message
    assert "output[0]['a']: golden 1.0, got 2.0 (off by 1)" in message
    with pytest.raises(AssertionError, match="golden has 1 item\\(s\\), got 2"):
        assert_matches_golden([{"a": 1.0, "b": [1, 2]}, {}], golden)


def test_golden_files_refuse_what_json_cannot_hold(tmp_path: Path):
    with pytest.raises(AssertionError, match="cannot be stored as a JSON golden file.*\n.*Out of range float"):
        assert_matches_golden([math.nan], tmp_path / "nan.json", regen=True)
    with pytest.raises(AssertionError, match="bytes item: golden files hold JSON"):
        assert_matches_golden([b"\x89PNG"], tmp_path / "bytes.json", regen=True)
    assert not list(tmp_path.iterdir())


def test_golden_files_that_are_no_json_or_differ_much_say_so(tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(AssertionError, match=r"the golden file .*broken\.json is not JSON .*\n  fix: regenerate it with pytest --hk-regen"):
        assert_matches_golden([1], broken)
    many = tmp_path / "many.json"
    assert_matches_golden(list(range(12)), many, regen=True)
    with pytest.raises(AssertionError) as caught:
        assert_matches_golden([n + 1 for n in range(12)], many)
    lines = str(caught.value).splitlines()
    assert sum(line.startswith("  output[") for line in lines) == 10 and "  ... and more" in lines


def test_regen_follows_the_plugins_flag_and_lists_what_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    written: list[Path] = []
    monkeypatch.setattr(testing, "written", written)
    monkeypatch.setattr(testing, "_regen", True)  # what pytest --hk-regen sets
    assert_matches_golden(hk.Harness(lengths, hk.MockContext()).run([{"body": b"ab"}]), tmp_path / "run.json")
    assert json.loads((tmp_path / "run.json").read_text()) == [2]  # a Run: its output is stored
    assert written == [(tmp_path / "run.json").resolve()]
    monkeypatch.setattr(testing, "_regen", False)
    with pytest.raises(AssertionError, match=r"output\[0\]: golden 2, got 3"):
        assert_matches_golden([3], tmp_path / "run.json")


# ---------------------------------------------------------------------------- as a user's CI meets them
BROKEN_TESTS = f"""
import torch.nn.functional as F

from handlerkit.handlers import ImageClassifier
from handlerkit.testing import assert_batch_parity, assert_contract

IMAGES = {str(IMAGES)!r}


class Strict(ImageClassifier):
    \"\"\"Fails the whole batch on a bad image, as TorchServe's vision handlers do.\"\"\"

    def preprocess(self, data):
        images = super().preprocess(data)
        if self.request_errors:
            raise next(iter(self.request_errors.values()))
        return images


class ReturnsTensor(ImageClassifier):
    def postprocess(self, data):
        return F.softmax(data, dim=1)


class WrongSoftmax(ImageClassifier):
    def postprocess(self, data):
        return [{{self.mapping[str(i)]: p for i, p in enumerate(row)}} for row in F.softmax(data, dim=0).tolist()]


def test_strict(hk_harness, hk_request):
    batch = hk_request.batch(IMAGES + "/circle.png", IMAGES + "/star.jpg", {str(TRUNCATED)!r})
    assert_contract(hk_harness(Strict), batch)


def test_tensor(hk_harness, hk_request):
    assert_contract(hk_harness(ReturnsTensor), hk_request.batch(IMAGES + "/circle.png", IMAGES + "/star.jpg"))


def test_parity(hk_harness, hk_request):
    assert_batch_parity(hk_harness(WrongSoftmax), hk_request.batch(IMAGES + "/circle.png", IMAGES + "/star.jpg"))
"""


def test_failing_user_tests_name_the_stage_the_request_and_the_fix(pytester: pytest.Pytester):
    write_ini(pytester, MODEL)
    pytester.makepyfile(test_broken=BROKEN_TESTS)
    result = run_pytest(pytester)
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    # The failure points at the user's line, not at handlerkit's internals (__tracebackhide__).
    assert "handlerkit/testing.py" not in out and "handlerkit/harness.py" not in out
    result.stdout.fnmatch_lines([
        "*assert_contract(hk_harness(Strict), batch)",
        "E*Strict failed on a batch of 3 request(s):",
        "E*1. preprocess, request 2 (truncated.png): RequestError: *the image is corrupt or truncated*",
        "E*fix: send the complete image file",
    ])
    result.stdout.fnmatch_lines([
        "E*ReturnsTensor broke TorchServe's contract on a batch of 2 request(s): 1 problem(s)",
        "E*1. postprocess, the whole batch: must return a list with one item per request, got Tensor[[]2, 5[]]*",
        "E*fix: return one item per request*",
    ])
    result.stdout.fnmatch_lines([
        "E*WrongSoftmax answers 2 request(s) differently alone than in a batch of 2*",
        "E*1. handle, request 0 (*circle.png): alone gives*",
        "E*fix: keep requests independent*",
    ])
