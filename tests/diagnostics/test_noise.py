"""Tests for handlerkit.diagnostics.noise: the rule that names a fastest only beyond the run's
noise (on synthetic timings: nothing here is timed), and the conditions every timed report states."""

from __future__ import annotations

import warnings

import pytest
import torch

from handlerkit.diagnostics.noise import Conditions, fastest
from handlerkit.diagnostics.timing import summarize
from handlerkit.errors import HandlerkitWarning
from handlerkit.worker import devices

# --- the fastest, beyond the run's noise ------------------------------------------------------


def test_a_lead_beyond_both_spreads_names_the_fastest() -> None:
    verdict = fastest({"eager": summarize([2.0, 2.1, 1.9, 2.0, 2.2]), "onnx": summarize([1.0, 1.1, 1.2, 1.1, 1.0])})
    assert (verdict.best, verdict.fastest, verdict.within_noise) == ("onnx", "onnx", ("onnx",))
    assert verdict.reason == (
        "onnx is fastest: 1.1 ms (p25-p75 1-1.1) against eager 2 ms (p25-p75 2-2.1), a lead beyond both spreads"
    )


def test_a_lead_inside_the_noise_names_no_winner() -> None:
    # Two runs a minute apart named TorchScript, then ONNX: their middle halves overlap.
    timings = {
        "torchscript": summarize([0.40, 0.42, 0.55, 0.41, 0.60]),
        "onnx": summarize([0.43, 0.39, 0.58, 0.44, 0.50]),
    }
    verdict = fastest(timings)
    assert verdict.best is None and verdict.fastest == "torchscript"
    assert verdict.within_noise == ("torchscript", "onnx")
    assert verdict.reason == (
        "no clear winner (within noise: torchscript 0.42 ms (p25-p75 0.41-0.55), onnx 0.44 ms (p25-p75 0.43-0.5))"
    )
    assert verdict.to_dict()["best"] is None


def test_a_lead_equal_to_the_noise_is_no_lead() -> None:
    # a: median 1, p75 2; b: p25 2, median 3. The lead (2) equals the noise (1 + 1).
    tie = fastest({"a": summarize([1.0, 1.0, 1.0, 2.0, 2.0]), "b": summarize([2.0, 2.0, 3.0, 3.0, 3.0])})
    assert tie.best is None and tie.within_noise == ("a", "b")
    ahead = fastest({"a": summarize([1.0, 1.0, 1.0, 2.0, 2.0]), "b": summarize([2.1, 2.1, 3.0, 3.0, 3.0])})
    assert ahead.best == "a"


def test_steady_timings_without_spread_differ_by_any_lead() -> None:
    assert fastest({"b": summarize([1.5] * 3), "a": summarize([1.0] * 3)}).best == "a"
    same = fastest({"a": summarize([1.0] * 3), "b": summarize([1.0] * 3)})
    assert same.best is None and same.within_noise == ("a", "b")


def test_one_tied_runner_up_is_enough_for_no_winner() -> None:
    verdict = fastest(
        {
            "eager": summarize([5.0, 5.2, 4.9, 5.1]),
            "torchscript": summarize([1.0, 1.4, 1.1, 1.3]),
            "onnx": summarize([1.2, 1.3, 1.1, 1.5]),
        }
    )
    assert verdict.best is None and verdict.within_noise == ("torchscript", "onnx")  # eager is clearly behind


def test_too_few_calls_measure_no_noise_and_one_timing_wins_alone() -> None:
    few = fastest({"a": summarize([1.0, 1.0]), "b": summarize([9.0, 9.0, 9.0])})
    assert few.best is None and few.fastest == "a"
    assert few.reason == (
        "no clear winner (within noise: too few timed calls to measure it, a 2; time at least 3 calls each)"
    )
    alone = fastest({"eager": summarize([3.0])})
    assert (alone.best, alone.reason) == ("eager", "eager is the only one timed")
    nothing = fastest({})
    assert (nothing.best, nothing.fastest, nothing.reason) == (None, None, "nothing was timed")


# --- the conditions ---------------------------------------------------------------------------


def test_conditions_note_and_warn_once_with_the_spelling_in_force(monkeypatch) -> None:
    monkeypatch.setattr(devices.os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1})
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        in_python = Conditions.measure()
        with devices.threads_advice("run with --threads {n}"):
            on_the_cli = Conditions.measure()
    finally:
        torch.set_num_threads(before)
    assert in_python.warning is not None and in_python.warning.endswith("or torch.set_num_threads(1) for a small model")
    assert on_the_cli.warning is not None and on_the_cli.warning.endswith("or run with --threads 1 for a small model")
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", HandlerkitWarning)  # said once: in the notes, not on stderr too
        on_the_cli.report(notes)
    assert notes == [f"torch: {on_the_cli.threads}", on_the_cli.warning]
    assert on_the_cli.to_dict() == {
        "intra_op_threads": 2,
        "inter_op_threads": on_the_cli.threads.inter_op,
        "cores": 2,
        "load_1min": 6.0,
        "warning": on_the_cli.warning,
    }
