"""TorchServe 0.12's handler unit tests, run with ``hk.MockContext`` swapped in for their test mock.

The suite installed with torchserve (``ts/torch_handler/unit_tests``: the base handler, the
envelopes, the image classifier, segmenter and object detector, MNIST under the KServe
envelopes) runs in a pytest subprocess, on the installed package, once with TorchServe's own
MockContext and once with handlerkit's (``_ts_unit_plugin.py`` swaps it in before the suite is
imported). What the suite reads from a pytorch/serve checkout and downloads is a stand-in built
here (``_ts_standins.py``): nothing downloads. Every test passes with ours as with theirs, and
a mock that fails header reads before a batch is bound, as ours did, fails the suite.

``ts/tests/unit_tests/test_micro_batching.py`` is not installed with torchserve: its behaviours
are tested in ``test_context_micro_batching.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _ts_standins
import pytest

pytestmark = pytest.mark.torchserve

TESTS_DIR = Path(__file__).resolve().parents[1]

#: TorchServe 0.12's handler unit tests, by module: all of them.
SUITE = {
    "test_base_handler.py": [
        "test_batch_handle",
        "test_inference_with_profiler_works_with_custom_initialize_method",
        "test_single_handle",
    ],
    "test_envelopes.py": ["test_binary", "test_body", "test_json", "test_json_batch", "test_json_double_batch"],
    "test_image_classifier.py": ["test_handle", "test_handle_explain"],
    "test_image_segmenter.py": ["test_handle"],
    "test_mnist_kf.py": ["test_handle", "test_handle_kf", "test_handle_kfv2"],
    "test_object_detector.py": ["test_handle"],
}
EVERY_TEST = {f"{module}::{name}" for module, names in SUITE.items() for name in names}

THEIR_MOCK = "ts.torch_handler.unit_tests.test_utils.mock_context.MockContext"
OUR_MOCK = "handlerkit.worker.context.MockContext"


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ts_standins.build(tmp_path_factory.mktemp("pytorch_serve"))


def run_suite(standins: Path, mock: str, folder: Path, *modules: str) -> dict[str, dict]:
    """Run the installed suite (or some of its modules) in a pytest subprocess with ``mock``;
    per test ``module::name``, its outcome and the contexts its test function got."""
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\n")
    report = folder / "report.json"
    targets = [f"ts.torch_handler.unit_tests.{Path(m).stem}" for m in modules] or ["ts.torch_handler.unit_tests"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        # Only our plugin: nbval, handlerkit's own and the rest are no part of TorchServe's suite.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    env.pop("ENABLE_TORCH_PROFILER", None)  # the suite sets it itself, midway, as in TorchServe's CI
    command = [
        sys.executable, "-m", "pytest", "--pyargs", *targets,
        "-p", "_ts_unit_plugin", "-p", "no:cacheprovider", "-c", str(folder / "pytest.ini"),
        "--rootdir", str(folder), "--basetemp", str(folder / "tmp"),
        "--standins", str(standins), "--mock", mock, "--report", str(report), "-q",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert report.is_file(), f"the suite did not run ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    results = json.loads(report.read_text())
    results["_output"] = {"outcome": "", "text": done.stdout[-6000:]}
    return results


def outcomes(results: dict[str, dict]) -> dict[str, str]:
    return {test: entry["outcome"] for test, entry in results.items() if test != "_output"}


def test_torchserves_handler_unit_tests_pass_with_our_mock_context_as_with_theirs(standins, tmp_path):
    theirs = run_suite(standins, "torchserve", tmp_path / "theirs")
    ours = run_suite(standins, "handlerkit", tmp_path / "ours")
    assert outcomes(theirs) == dict.fromkeys(EVERY_TEST, "passed"), theirs["_output"]["text"]
    assert outcomes(ours) == outcomes(theirs), ours["_output"]["text"]
    # Every test got a context, and the mock of its run: ours was swapped in everywhere.
    for results, mock in ((theirs, THEIR_MOCK), (ours, OUR_MOCK)):
        assert {test: results[test]["contexts"] for test in EVERY_TEST} == {test: [mock] for test in EVERY_TEST}
    # The profiler test left ENABLE_TORCH_PROFILER set: later tests ran profiled, traces in the run's folder.
    assert list((tmp_path / "ours" / "tmp" / "pytorch_profiler").rglob("*.pt.trace.json"))


def test_a_mock_whose_header_reads_fail_before_a_batch_fails_the_suite(standins, tmp_path):
    """The control: handlerkit's MockContext as it was (header reads before a batch raised, as
    on the worker's Context) fails every test whose handler reads a header."""
    results = run_suite(standins, "unbound-fails", tmp_path / "control", "test_base_handler.py", "test_envelopes.py")
    assert outcomes(results) == {
        **{f"test_base_handler.py::{name}": "failed" for name in SUITE["test_base_handler.py"]},
        **{f"test_envelopes.py::{name}": "failed" for name in SUITE["test_envelopes.py"]},
        "test_envelopes.py::test_binary": "passed",  # its handle is a lambda that reads no header
    }
    assert "TypeError: 'NoneType' object is not subscriptable: no batch is bound" in results["_output"]["text"]
