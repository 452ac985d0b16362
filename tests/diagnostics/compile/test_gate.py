"""handlerkit.diagnostics.compile.gate: the recompile gate's pieces, on a harness double (the
gate on real compiled models is tested in tests/diagnostics/compile/test_report.py)."""

from __future__ import annotations

import pytest
import torch

import handlerkit as hk
from handlerkit.diagnostics.compile.gate import (
    FIX_DYNAMIC,
    FIX_SIZE_ONE,
    GateResult,
    _guard_failures,
    _recompile_error,
    check_sizes,
    eager_model,
    fix_for,
    gate_problems,
    run_gate,
)
from handlerkit.errors import StageError

# What torch 2.x's fail_on_recompile stance raises (its format, read from a real one).
STANCE_MESSAGE = (
    "Detected recompile when torch.compile stance is 'fail_on_recompile'. filename: 'model.py', "
    "function name: 'forward', line number: 12\n"
    "    triggered by the following guard failure(s):\n"
    "    - 0/0: tensor 'x' size mismatch at index 0. expected 2, actual 4\n"
    "    - 0/1: 2 <= L['x'].size()[0]"
)


class Callable_:
    def __call__(self, x):
        return x


def test_eager_model_finds_what_torch_compile_wraps():
    linear = torch.nn.Linear(2, 2)

    def double(x):
        return 2 * x

    obj = Callable_()
    assert eager_model(torch.compile(linear, backend="eager")) is linear
    assert eager_model(torch.compile(double, backend="eager")) is double
    assert eager_model(torch.compile(obj, backend="eager")) is obj
    assert eager_model(linear) is None and eager_model(None) is None and eager_model(double) is None


def test_the_guard_failures_are_read_from_the_stance_message():
    assert _guard_failures(STANCE_MESSAGE) == (
        "0/0: tensor 'x' size mismatch at index 0. expected 2, actual 4; 0/1: 2 <= L['x'].size()[0]"
    )
    assert _guard_failures("something else\nsecond line") == "something else"


@pytest.mark.parametrize(
    "reason, fix",
    [
        ("0/0: 2 <= L['x'].size()[0]", FIX_SIZE_ONE),
        ("0/0: tensor 'x' size mismatch at index 0. expected 2, actual 4", FIX_DYNAMIC),
        ("L['x'].size()[1] == 3", FIX_DYNAMIC),
        ("0/0: ___check_type_id(L['flag'])", "make the inputs match what the model was compiled for, or " + FIX_DYNAMIC),
    ],
)
def test_the_fix_follows_the_guard(reason, fix):
    assert fix_for(reason) == fix


def test_the_stance_error_is_found_in_a_stage_errors_chain():
    stance = RuntimeError(STANCE_MESSAGE)
    wrapped = StageError("inference failed", stage="inference", original=stance)
    assert _recompile_error(wrapped) is stance
    try:
        try:
            raise stance
        except RuntimeError as inner:
            raise ValueError("while handling") from inner
    except ValueError as outer:
        assert _recompile_error(outer) is stance
    assert _recompile_error(StageError("no", stage="inference", original=KeyError("x"))) is None


class View:
    """A harness double: each run's batch size decides what the 'model' does."""

    def __init__(self, outcomes, batch_size=None, config=None):
        self.outcomes = outcomes
        self.sizes: list[int] = []
        self.context = hk.MockContext(gpu_id=None, model_yaml_config=config or {})
        if batch_size is not None:
            self.context.system_properties["batch_size"] = batch_size

    def run(self, batch):
        self.sizes.append(len(batch))
        outcome = self.outcomes.get(len(batch))
        if outcome is not None:
            raise StageError("inference failed", stage="inference", original=outcome)


def test_run_gate_replays_each_size_and_judges_it():
    view = View({4: RuntimeError(STANCE_MESSAGE), 8: KeyError("boom")})
    batch = hk.batch(hk.Request.json([1.0]), hk.Request.json([2.0]))
    results, stance = run_gate(view, batch, [2, 4, 8])
    assert view.sizes == [2, 4, 8]
    assert stance is (getattr(torch.compiler, "set_stance", None) is not None)
    assert [r.outcome for r in results] == ["no recompile", "recompiles", "fails"]
    assert results[1].fix == FIX_SIZE_ONE  # one of its guards is the size-1 specialisation
    assert results[2].reason == "KeyError: inference failed"


def test_gate_problems_one_warning_per_fix():
    results = [
        GateResult(1, "recompiles", "2 <= L['x'].size()[0]", FIX_SIZE_ONE),
        GateResult(2, "no recompile"),
        GateResult(4, "recompiles", "size mismatch at index 0", FIX_DYNAMIC),
        GateResult(8, "recompiles", "size mismatch at index 0", FIX_DYNAMIC),
        GateResult(16, "fails", "KeyError: boom"),
    ]
    problems = gate_problems(results)
    assert [(p.check, p.severity, p.fix) for p in problems] == [
        ("recompile", "warning", FIX_SIZE_ONE), ("recompile", "warning", FIX_DYNAMIC), ("recompile", "warning", ""),
    ]
    assert "batch size 4, 8 " in problems[1].message
    assert problems[2].message == "batch size 16 fails: KeyError: boom"
    assert gate_problems([GateResult(2, "no recompile")]) == []


@pytest.mark.parametrize(
    "requests, batch_size, config, sizes",
    [(1, None, {}, [1]), (3, None, {}, [1, 2, 3]), (2, 8, {}, [1, 2, 4, 8]), (2, None, {"batchSize": 6}, [1, 2, 4, 6]),
     (2, True, {"batchSize": "8"}, [1, 2])],  # what is no int is not a batch size
)
def test_check_sizes_go_up_to_the_configured_batch(requests, batch_size, config, sizes):
    view = View({}, batch_size, config)
    assert check_sizes(view, hk.batch(*(hk.Request.json([1.0]) for _ in range(requests)))) == sizes
