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


def test_builtin_benchmark_judges_answers_against_torchserve(tmp_path, capsys):
    """The benchmark's exactness check on two of its photo-like JPEGs: handlerkit's answers are
    TorchServe's own ImageClassifier's, bit for bit, on resnet18; the fast_resize opt-in's are not."""
    import builtin_vs_torchserve as bench
    from ts.torch_handler.image_classifier import ImageClassifier as TorchServeImageClassifier

    import handlerkit as hk

    model_dir = bench.resnet18_model_dir(str(tmp_path))
    batch = hk.batch(*(hk.Request.from_bytes(image, "image/jpeg") for image in bench.photo_jpegs(n=2)))
    ts = bench.Contender("TorchServe 0.12", TorchServeImageClassifier(), model_dir)
    ours = bench.Contender("handlerkit", hk.handlers.ImageClassifier(), model_dir)
    fast = bench.Contender("fast", hk.handlers.ImageClassifier(), model_dir, {"handler": {"fast_resize": True}})
    assert bench.check_answers("two photos", ts, [ours], batch)
    out = capsys.readouterr().out
    assert "top-1 same on 2/2" in out and out.rstrip().endswith(" identical")
    assert not bench.check_answers("two photos", ts, [fast], batch)  # the check can fail
    assert "MISSED: not identical" in capsys.readouterr().out
    same, total, worst, _ = bench.agreement([{"a": 0.6, "b": 0.4}], [{"b": 0.55, "a": 0.45}])
    assert (same, total) == (0, 1) and abs(worst - 0.05) < 1e-9  # the check can fail
