"""handlerkit.diagnostics._view: the members of a harness diagnostics may use, and only those."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import handlerkit as hk
from handlerkit.diagnostics._view import HarnessView
from handlerkit.diagnostics.timing import time_stages
from handlerkit.recording.results import Run, StageResult

DIAGNOSTICS = Path(__file__).resolve().parents[2] / "handlerkit" / "diagnostics"


def members() -> set[str]:
    names = set(HarnessView.__annotations__)
    names |= {n for n, v in vars(HarnessView).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def used_members(source: str) -> dict[str, set[str]]:
    """``{function: attributes}`` read from each parameter annotated ``HarnessView``."""
    used: dict[str, set[str]] = {}
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = {a.arg for a in func.args.args + func.args.kwonlyargs
                  if a.annotation is not None and ast.unparse(a.annotation) == "HarnessView"}
        for node in ast.walk(func):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in params:
                used.setdefault(func.name, set()).add(node.attr)
    return used


def test_the_harness_has_every_member():
    h = hk.Harness(lambda data, context: data, hk.MockContext(gpu_id=None))
    missing = sorted(name for name in members() if not hasattr(h, name))
    assert not missing, f"HarnessView lists members the Harness lacks: {missing}"


def test_diagnostics_use_only_the_members_it_lists():
    listed = members()
    beyond = {
        f"{path.relative_to(DIAGNOSTICS)}:{func}": sorted(attrs - listed)
        for path in sorted(DIAGNOSTICS.rglob("*.py"))
        for func, attrs in used_members(path.read_text(encoding="utf-8")).items()
        if attrs - listed
    }
    assert not beyond, f"add these to HarnessView (and its docstring) or stop using them: {beyond}"


def test_the_scan_sees_a_member_used_beyond_the_list():
    planted = "def f(view: HarnessView, other):\n    view._capture.clear(); view.run(1); other._secret\n"
    assert used_members(planted) == {"f": {"_capture", "run"}}


class Double:
    """A harness double that has the members HarnessView lists, nothing more."""

    name = "Double"
    single_stage = False
    entry = None

    def __init__(self) -> None:
        self.context = hk.MockContext(gpu_id=None)
        self.handler = None
        self.results: dict[str, StageResult] = {}
        self.batch = None
        self.track_memory = True
        self.tracked: list[bool] = []

    def initialize(self) -> StageResult:
        self.results["initialize"] = StageResult("initialize")
        return self.results["initialize"]

    def run(self, batch_or_data):
        self.tracked.append(self.track_memory)
        stages = {"preprocess": StageResult("preprocess", wall_ms=2.0),
                  "inference": StageResult("inference", wall_ms=9.0, device_ms=4.0)}
        self.results.update(stages)
        return Run(output=[1], stages=stages, batch_size=1)

    def imports(self):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def preserved(self):
        saved = dict(self.results)
        yield
        self.results = saved


def test_a_double_with_those_members_serves_a_diagnostic():
    double = Double()
    assert not members() - set(dir(double))
    report = time_stages(double, hk.batch(hk.Request.json([1])), warmup=1, repeat=3, progress=False)
    assert report.stages["preprocess"].median == 2.0
    assert report.stages["inference"].median == 4.0  # device time where there is one
    assert double.tracked == [False] * 4 and double.track_memory
    assert list(double.results) == ["initialize"]
