"""The pytest plugin (handlerkit.pytest_plugin) and its assertions (handlerkit.testing), as a
user's CI meets them: user test files run by a real pytest in a subprocess (``pytester``).

Each subprocess run costs 1-4 s (torch and the model load in it), so user files hold several
tests and the golden-file logic is also tested directly, in-process.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from handlerkit.testing import assert_matches_golden

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
TRUNCATED = ROOT / "fixtures" / "bad" / "truncated.png"


def _plugin_args() -> list[str]:
    """Load the plugin explicitly unless the installed entry point does it: pytest refuses the
    same module registered twice (as "handlerkit" by the entry point and by ``-p``)."""
    installed = any(ep.value == "handlerkit.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "handlerkit.pytest_plugin"]


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # nbval's plugin alone costs ~1.7 s of imports per pytest start; these runs need none of it.
    return pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "-p", "no:nbval", *args)


def _ini(pytester: pytest.Pytester, model: str | Path | None) -> None:
    pytester.makeini("[pytest]\n" + (f"hk_model_dir = {model}\n" if model is not None else ""))


# ---------------------------------------------------------------------------- the plugin's cost
def test_importing_the_plugin_imports_no_torch_and_no_heavy_handlerkit_module():
    """pytest loads pytest11 plugins in every run of every project in the environment."""
    code = (
        "import sys, handlerkit\n"
        "before = set(sys.modules)\n"
        "import handlerkit.pytest_plugin\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(('torch', 'handlerkit'))))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(ROOT))
    assert out.stdout.split("\n")[:2] == ["['handlerkit.pytest_plugin']", "False"]


def test_the_entry_point_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["pytest11"] == {"handlerkit": "handlerkit.pytest_plugin"}


# ---------------------------------------------------------------------------- a passing suite
SHAPES_TEST = """
from handlerkit.testing import assert_batch_parity, assert_contract, assert_matches_golden


def test_shapes(hk_harness, hk_request, hk_context):
    assert hk_context.model_name == "image_classifier"
    h = hk_harness()  # the manifest's handler: the built-in image_classifier
    batch = hk_request.batch("images/circle.png", "images/star.jpg")  # next to this file
    run = assert_contract(h, batch)
    assert [max(item, key=item.get) for item in run.output] == ["circle", "star"]
    assert_batch_parity(h, batch)
    assert_matches_golden(run, hk_request.path("golden/shapes.json"))
"""


def test_a_user_suite_passes_writes_its_golden_with_hk_regen_then_compares(pytester: pytest.Pytester):
    _ini(pytester, MODEL)
    tests = pytester.mkdir("tests")
    (tests / "images").mkdir()
    for name in ("circle.png", "star.jpg"):
        shutil.copy(IMAGES / name, tests / "images" / name)
    (tests / "test_shapes.py").write_text(SHAPES_TEST, encoding="utf-8")
    golden = tests / "golden" / "shapes.json"

    result = _run(pytester, "--hk-regen")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*handlerkit --hk-regen*", "wrote 1 golden file(s) instead of comparing*", "  tests/golden/shapes.json"])
    written = json.loads(golden.read_text(encoding="utf-8"))
    assert [max(item, key=item.get) for item in written] == ["circle", "star"]

    # Compared now; the model named on the command line (relative to where pytest starts)
    # wins over a wrong ini value.
    _ini(pytester, "/nonexistent/model")
    relative = Path(os.path.relpath(MODEL, pytester.path))
    _run(pytester, f"--hk-model-dir={relative}").assert_outcomes(passed=1)

    written[0]["circle"] = 0.5
    golden.write_text(json.dumps(written), encoding="utf-8")
    result = _run(pytester, f"--hk-model-dir={relative}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the output differs from the golden file*shapes.json*",
        "*output[[]0[]][[]'circle'[]]: golden 0.5, got 0.98*",
        "*fix: correct the handler, or if the change is intended, rerun with --hk-regen*",
    ])


# ---------------------------------------------------------------------------- failing user tests
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
    _ini(pytester, MODEL)
    pytester.makepyfile(test_broken=BROKEN_TESTS)
    result = _run(pytester)
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


# ---------------------------------------------------------------------------- configuration
USES_CONTEXT = """
def test_context(hk_context, request):
    assert hk_context.model_name == "image_classifier"
    assert hk_context.system_properties["model_dir"] == str(request.config.rootpath / "model")


def test_harness(hk_harness):
    hk_harness()
"""


def test_the_model_option_unset_missing_or_relative_to_the_ini_file(pytester: pytest.Pytester):
    pytester.makepyfile(test_ctx=USES_CONTEXT)
    _ini(pytester, None)
    result = _run(pytester)
    result.assert_outcomes(errors=1, failed=1)  # the fixture's setup error; the factory's failure
    result.stdout.fnmatch_lines(["*no model configured for hk_context/hk_harness: set the ini option hk_model_dir*--hk-model-dir=PATH*"])
    assert "Traceback" not in result.stdout.str()

    result = _run(pytester, "--hk-model-dir=missing")
    result.assert_outcomes(errors=1, failed=1)
    result.stdout.fnmatch_lines([f"*--hk-model-dir names {pytester.path / 'missing'}, which does not exist*"])

    shutil.copytree(MODEL, pytester.path / "model")
    _ini(pytester, "model")
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"handlerkit: model {pytester.path / 'model'} (from the ini option hk_model_dir)"])


# ---------------------------------------------------------------------------- a .mar
MAR_TEST = f"""
EXTRACTED = []


def test_mar(hk_harness, hk_request, hk_context):
    assert hk_context.model_name == "image_classifier"
    EXTRACTED.append(hk_context.archive.path)
    h = hk_harness()
    EXTRACTED.append(h.context.archive.path)
    run = h.run(hk_request.batch({str(IMAGES / "circle.png")!r}))
    assert max(run.output[0], key=run.output[0].get) == "circle"


def test_the_extracted_dirs_went_with_the_test():
    assert len(EXTRACTED) == 2 and not any(path.exists() for path in EXTRACTED)
"""


def test_hk_model_dir_may_name_a_mar_archive(pytester: pytest.Pytester):
    """Needs handlerkit.archive (MockContext.from_mar), built alongside the plugin (issue 12)."""
    from handlerkit.context import MockContext

    if not hasattr(MockContext, "from_mar"):
        pytest.skip("MockContext.from_mar is not there yet (handlerkit.archive lands with issue 12)")
    mar = pytester.path / "image_classifier.mar"
    with zipfile.ZipFile(mar, "w") as archive:  # a default-format .mar: the model dir, zipped
        for file in sorted(MODEL.rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(MODEL).as_posix())
    _ini(pytester, mar)
    pytester.makepyfile(test_mar=MAR_TEST)
    _run(pytester).assert_outcomes(passed=2)


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
