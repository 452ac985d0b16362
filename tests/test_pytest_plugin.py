"""handlerkit.pytest_plugin, as a user's CI meets it: user test files run by a real pytest in a
subprocess (``pytester``): its cost at import, its options, its fixtures, ``--hk-regen`` and a
``.mar`` as the model. Its assertions (handlerkit.testing) are tested in test_testing.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from _user_suites import IMAGES, MODEL, ROOT, run_pytest, write_ini

pytest_plugins = ["pytester"]


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
    write_ini(pytester, MODEL)
    tests = pytester.mkdir("tests")
    (tests / "images").mkdir()
    for name in ("circle.png", "star.jpg"):
        shutil.copy(IMAGES / name, tests / "images" / name)
    (tests / "test_shapes.py").write_text(SHAPES_TEST, encoding="utf-8")
    golden = tests / "golden" / "shapes.json"

    result = run_pytest(pytester, "--hk-regen")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*handlerkit --hk-regen*", "wrote 1 golden file(s) instead of comparing*", "  tests/golden/shapes.json"])
    written = json.loads(golden.read_text(encoding="utf-8"))
    assert [max(item, key=item.get) for item in written] == ["circle", "star"]

    # Compared now; the model named on the command line (relative to where pytest starts)
    # wins over a wrong ini value.
    write_ini(pytester, "/nonexistent/model")
    relative = Path(os.path.relpath(MODEL, pytester.path))
    run_pytest(pytester, f"--hk-model-dir={relative}").assert_outcomes(passed=1)

    written[0]["circle"] = 0.5
    golden.write_text(json.dumps(written), encoding="utf-8")
    result = run_pytest(pytester, f"--hk-model-dir={relative}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the output differs from the golden file*shapes.json*",
        "*output[[]0[]][[]'circle'[]]: golden 0.5, got 0.98*",
        "*fix: correct the handler, or if the change is intended, rerun with --hk-regen*",
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
    write_ini(pytester, None)
    result = run_pytest(pytester)
    result.assert_outcomes(errors=1, failed=1)  # the fixture's setup error; the factory's failure
    result.stdout.fnmatch_lines(["*no model configured for hk_context/hk_harness: set the ini option hk_model_dir*--hk-model-dir=PATH*"])
    assert "Traceback" not in result.stdout.str()

    result = run_pytest(pytester, "--hk-model-dir=missing")
    result.assert_outcomes(errors=1, failed=1)
    result.stdout.fnmatch_lines([f"*--hk-model-dir names {pytester.path / 'missing'}, which does not exist*"])

    shutil.copytree(MODEL, pytester.path / "model")
    write_ini(pytester, "model")
    result = run_pytest(pytester)
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
    """The fixtures open it with MockContext.from_mar: extracted per test, removed after it."""
    mar = pytester.path / "image_classifier.mar"
    with zipfile.ZipFile(mar, "w") as archive:  # a default-format .mar: the model dir, zipped
        for file in sorted(MODEL.rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(MODEL).as_posix())
    write_ini(pytester, mar)
    pytester.makepyfile(test_mar=MAR_TEST)
    run_pytest(pytester).assert_outcomes(passed=2)
