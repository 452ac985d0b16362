"""The benchmark scripts run (their targets are judged by running them, not here: timings
on a shared machine are too noisy for a test)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import harness_overhead  # noqa: E402

from handlerkit.cli import demo_paths  # noqa: E402


def test_overhead_measure_times_every_variant_in_every_round():
    model_dir, images = demo_paths()
    bare_ms, extras = harness_overhead.measure(model_dir, images[0], rounds=3, warmup=1, block=2)
    assert bare_ms > 0
    assert set(extras) == {label for label, _, _ in harness_overhead.VARIANTS}
    assert all(len(samples) == 3 for samples in extras.values())
