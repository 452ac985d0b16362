"""A pytest plugin that runs TorchServe 0.12's installed handler unit tests with a chosen MockContext.

Loaded with ``-p _ts_unit_plugin`` in a pytest subprocess (test_context_torchserve_unit_tests.py)
collecting ``--pyargs ts.torch_handler.unit_tests``. Before the suite is imported it:

- swaps the suite's MockContext (``ts.torch_handler.unit_tests.test_utils.mock_context``) for
  ``--mock``: ``handlerkit`` (``hk.MockContext``), ``torchserve`` (theirs, left in place) or
  ``unbound-fails`` (ours with header reads failing before a batch is bound, as they did before
  it was a drop-in: a control that the suite notices);
- replaces the suite's ``download_model`` with a copy of the stand-in weights built by
  ``_ts_standins.build`` (``--standins``): nothing downloads;
- points each test module's ``REPO_DIR`` (the pytorch/serve checkout it reads examples and
  images from) at the stand-in checkout, and puts it on ``sys.path`` (the MNIST test imports
  ``examples.image_classifier.mnist.mnist_handler``);
- sends the traces of ``ENABLE_TORCH_PROFILER`` runs (the base-handler test sets it and leaves it
  set, so the later tests run profiled, as in TorchServe's own CI) into the run's temporary
  folder instead of ``/tmp/pytorch_profiler``.

``--report FILE`` gets, per test (``test_module.py::test_name``), its outcome and the class of
every context its test function received, as JSON.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

_report: dict[str, dict[str, Any]] = {}
_names: dict[str, str] = {}  # node id -> "test_module.py::test_name" (node ids depend on how the run was asked)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ts-unit-tests", "TorchServe's handler unit tests with a chosen MockContext")
    group.addoption("--standins", required=True, help="the stand-in pytorch/serve checkout (_ts_standins.build)")
    group.addoption("--mock", choices=("handlerkit", "torchserve", "unbound-fails"), default="handlerkit")
    group.addoption("--report", default=None, help="write each test's outcome and contexts here (JSON)")


def _unbound_fails() -> type:
    import handlerkit as hk

    class UnboundReadsFail(hk.MockContext):
        """handlerkit's MockContext with header reads failing before any batch, as the worker's Context's."""

        def get_request_header(self, idx: int, key: str) -> Any:
            if self.request_processor is None:
                raise TypeError("'NoneType' object is not subscriptable: no batch is bound")
            return super().get_request_header(idx, key)

    return UnboundReadsFail


def pytest_configure(config: pytest.Config) -> None:
    import _ts_standins
    import torch.profiler
    from ts.torch_handler.unit_tests.test_utils import mock_context, model_dir

    standins = Path(config.getoption("--standins")).resolve()
    config._ts_standins = standins  # type: ignore[attr-defined]
    sys.path.insert(0, str(standins))

    mock = config.getoption("--mock")
    if mock == "handlerkit":
        import handlerkit as hk

        mock_context.MockContext = hk.MockContext
    elif mock == "unbound-fails":
        mock_context.MockContext = _unbound_fails()

    def download_model(model_url: str, model_dir: Path) -> None:
        shutil.copy(_ts_standins.weights_for(standins, model_url), Path(model_dir) / "model.pt")

    model_dir.download_model = download_model

    traces = Path(config.getoption("basetemp") or standins) / "pytorch_profiler"
    trace_handler = torch.profiler.tensorboard_trace_handler

    def tensorboard_trace_handler(dir_name: str, *args: Any, **kwargs: Any) -> Any:
        inside = Path(dir_name).relative_to("/tmp/pytorch_profiler") if dir_name.startswith("/tmp/pytorch_profiler") else None
        return trace_handler(str(traces / inside) if inside is not None else dir_name, *args, **kwargs)

    torch.profiler.tensorboard_trace_handler = tensorboard_trace_handler


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        _names[item.nodeid] = f"{item.path.name}::{item.name}"
        _report[_names[item.nodeid]] = {"outcome": "passed", "contexts": []}
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "REPO_DIR"):
            module.REPO_DIR = config._ts_standins  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    funcargs = getattr(item, "funcargs", {})
    contexts = sorted(
        {f"{type(v).__module__}.{type(v).__qualname__}" for v in funcargs.values() if hasattr(v, "get_request_header")}
    )
    _report[_names[item.nodeid]]["contexts"] = contexts


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _report[_names[report.nodeid]]
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--report")
    if path:
        Path(path).write_text(json.dumps(_report, indent=1, sort_keys=True))
