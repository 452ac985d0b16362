"""diagnostics.format_lab.export: a format made from the eager model, or the error, the model's line and the fix."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _format_lab import BRANCH_MODEL_PY  # the data-dependent branch on line 11

from conftest import MLP_MODEL_PY, load_model_class, write_model_dir
from handlerkit.diagnostics.format_lab.export import explain_failure, make, quiet

#: Line 10 raises a plain Python error under the exporter only (it traces with fake tensors).
RAISES_MODEL_PY = '''\
import torch


class Raises(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x) if type(x) is torch.Tensor else x.no_such_method()
'''


class Handler:
    device = torch.device("cpu")


def test_an_error_in_the_traceback_points_at_the_models_line(tmp_path):
    model = load_model_class(write_model_dir(tmp_path / "m", MLP_MODEL_PY) / "model.py")()
    try:
        model(torch.zeros(2, 5))  # fc1 wants 4 features: the error is raised inside torch, from line 11
    except RuntimeError as exc:
        failure = explain_failure("export", exc, model)
    assert failure.where == "model.py:11"
    assert failure.source == "return self.fc2(torch.relu(self.fc1(x)))"
    assert failure.error.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert failure.fix == "change the model at model.py:11 so that torch.export.export can follow it, or serve a format that exported"


def test_a_missing_package_fix_is_the_pip_command():
    failure = explain_failure("onnx", ImportError("exporting to ONNX needs onnxscript: pip install 'handlerkit[onnx]'"), torch.nn.Linear(1, 1))
    assert failure.where is None
    assert failure.fix == "exporting to ONNX needs onnxscript: pip install 'handlerkit[onnx]'"


def test_make_exports_and_loads_back(tmp_path):
    model = load_model_class(write_model_dir(tmp_path / "m", MLP_MODEL_PY) / "model.py")().eval()
    x = torch.randn(3, 4)
    made = make("export", model, (x,), str(tmp_path), Handler())
    assert made.exported and made.dynamic_batch is True and made.failure is None
    assert made.artifact_bytes == (tmp_path / "export-model.pt2").stat().st_size
    torch.testing.assert_close(made.model(x), model(x))
    assert "model" not in made.facts() and made.facts()["how"] == "torch.export.export, batch dimension dynamic (1 to 1024)"


def test_make_reports_a_failure_instead_of_raising(tmp_path):
    model = load_model_class(write_model_dir(tmp_path / "r", RAISES_MODEL_PY) / "model.py")().eval()
    made = make("export", model, (torch.randn(3, 4),), str(tmp_path), Handler())
    assert not made.exported and made.model is None
    assert made.failure is not None and made.failure.where == "model.py:10"
    assert made.failure.source == "return self.fc(x) if type(x) is torch.Tensor else x.no_such_method()"
    assert made.failure.error.startswith("AttributeError: ")


def test_quiet_keeps_every_kind_of_chatter_on_the_log_and_none_reaches_the_terminal(capfd):
    # A logger made before the block holds the stream it was made with, as torch's do.
    logger = logging.getLogger("torch.handlerkit_test_chatter")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    log: list[str] = []
    try:
        with quiet(log):
            print("printed to stdout")
            print("printed to stderr", file=sys.stderr)
            logger.warning("logged through a stream handler")
            warnings.warn("a deprecation", FutureWarning)
            os.write(2, b"native code on fd 2\n")
            os.write(1, b"native code on fd 1\n")
    finally:
        logger.removeHandler(handler)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    (said,) = log
    for line in ("printed to stdout", "printed to stderr", "logged through a stream handler",
                 "FutureWarning: a deprecation", "native code on fd 2", "native code on fd 1"):  # fmt: skip
        assert line in said
    assert handler.stream is sys.stderr  # put back
    with quiet(log):
        pass
    assert len(log) == 1  # a silent block adds nothing


def test_a_failing_exporters_graph_dump_is_kept_on_the_made_row(tmp_path, capfd):
    model = load_model_class(write_model_dir(tmp_path / "b", BRANCH_MODEL_PY) / "model.py")().eval()
    made = make("export", model, (torch.randn(3, 4),), str(tmp_path), Handler())
    out, err = capfd.readouterr()
    assert not made.exported and made.failure is not None and made.failure.where == "model.py:11"
    assert "if y.sum() > 0" in made.log  # torch logs the graph it stopped in
    assert "y.sum()" not in out + err and "Unable to find user code" not in err
