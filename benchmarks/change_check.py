"""The change check's cost: ``h.run`` in a tight loop on a tiny model, with and without it.

A Harness warns when the files its handler was loaded from changed ("handler.py changed since it
was loaded: h.reload() to run it"). Every run and stage looks (a ``stat`` per file, a read only of
a file whose mtime or size moved, or that was modified in the last two seconds); a diagnostic's
loop of runs (``h.time``, ``h.sweep`` …) looks once before it. Measured side by side in one run,
in rounds whose order rotates, on a Linear(4, 3) tabular model (the smallest run there is, so
the largest share the check can take), with memory tracking and log capture off:

* ``without the check``: ``warn_if_changed`` replaced by a no-op (one call remains);
* ``with the check``: as shipped, a look on every run.

A variant's cost is the median of its per-round differences to the first row, divided by the
median per-run time without the check.

Usage: python benchmarks/change_check.py [--rounds 30] [--block 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import handlerkit as hk
from handlerkit import harness as harness_module
from handlerkit.recording import reload as reloading

VARIANTS = ("without the check", "with the check")


def _variant(label: str) -> Callable[[], None]:
    """Put the variant in place; returns what puts things back."""
    if label == "without the check":
        harness_module.reloading = type("NoCheck", (), {"warn_if_changed": staticmethod(lambda service: None)})  # type: ignore[assignment]
        return lambda: setattr(harness_module, "reloading", reloading)
    return lambda: None


def measure(model_dir: str, rounds: int, block: int) -> dict[str, list[float]]:
    """Per-run microseconds of each variant, one sample per round (the mean of a block)."""
    h = hk.Harness.open(model_dir, track_memory=False, capture_logs=False)
    batch = hk.batch(hk.Request.json({"features": [0.5, -1.0, 2.0, 0.25]}))
    for _ in range(block):  # warm up
        h.run(batch)
    samples: dict[str, list[float]] = {label: [] for label in VARIANTS}
    for index in range(rounds):
        order = VARIANTS[index % len(VARIANTS) :] + VARIANTS[: index % len(VARIANTS)]
        for label in order:
            undo = _variant(label)
            try:
                start = time.perf_counter_ns()
                for _ in range(block):
                    h.run(batch)
                samples[label].append((time.perf_counter_ns() - start) / block / 1e3)
            finally:
                undo()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=200, help="runs per variant per round")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _tabular import tabular_dir

    with tempfile.TemporaryDirectory() as root:
        model_dir = str(tabular_dir(Path(root) / "tabular", base="handlerkit"))
        settled = time.time_ns() - 60 * 10**9  # files saved a minute ago: a file saved in the last two
        for file in Path(model_dir).glob("*.py"):  # seconds is read at every look (an edit may follow unseen)
            os.utime(file, ns=(settled, settled))
        samples = measure(model_dir, args.rounds, args.block)
        report(samples, args)
        print(f"  the check alone: {check_cost_us(model_dir):.2f} us a call; os.stat: {stat_cost_us():.2f} us")
    return 0


def report(samples: dict[str, list[float]], args: argparse.Namespace) -> None:
    base = statistics.median(samples[VARIANTS[0]])
    print(f"h.run on a Linear(4, 3) model, {args.rounds} rounds x {args.block} runs per variant (us per run, median)")
    for label in VARIANTS:
        diffs = [s - b for s, b in zip(samples[label], samples[VARIANTS[0]])]
        cost = statistics.median(diffs)
        print(f"  {label:<20} {statistics.median(samples[label]):8.1f} us   {cost:+7.2f} us   x{1 + cost / base:.4f}")


def check_cost_us(model_dir: str, n: int = 100000) -> float:
    """The check by itself (what every run pays): a stat per file of the handler's."""
    h = hk.Harness.open(model_dir, track_memory=False, capture_logs=False)
    start = time.perf_counter_ns()
    for _ in range(n):
        reloading.warn_if_changed(h.service)
    return (time.perf_counter_ns() - start) / n / 1e3


def stat_cost_us(n: int = 20000) -> float:
    path = os.path.abspath(__file__)
    start = time.perf_counter_ns()
    for _ in range(n):
        os.stat(path)
    return (time.perf_counter_ns() - start) / n / 1e3


if __name__ == "__main__":
    sys.exit(main())
