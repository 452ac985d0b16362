"""What finding the request at fault costs: a failed batch's ``h.run`` against a good one.

When ``inference`` fails for a batch of several, the Harness runs the requests alone (from
``preprocess``) until it knows one that fails and one that passes, to name the request at fault.
Measured side by side in one run, in rounds whose order rotates, on the multi-input ranker of
``tests/_new_users.py`` (user and item embeddings, item lists of 1 to 7 ids), batches of 8 and
64 requests:

* ``good batch``: every request readable (the baseline);
* ``bad first``: request 0 sends item id 99, which the embedding has no row for: the failing
  run, then two runs alone (request 0 fails, request 1 passes);
* ``bad last``: the last request sends it: every request runs alone before it is found.

Usage: python benchmarks/attribution.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import handlerkit as hk

VARIANTS = ("good batch", "bad first", "bad last")


def batches(size: int) -> dict[str, hk.Batch]:
    """The three batches of ``size`` requests."""
    from _new_users import ranker_request

    good = [hk.Request.json(ranker_request(i % 10, list(range(i % 7 + 1)))) for i in range(size)]
    bad = hk.Request.json(ranker_request(1, [99]))
    return {"good batch": hk.batch(*good), "bad first": hk.batch(bad, *good[1:]), "bad last": hk.batch(*good[:-1], bad)}


def measure(model_dir: str, size: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per ``h.run`` of each variant, one sample per round; a failing run must name
    its request (the run raises otherwise)."""
    h = hk.Harness.open(model_dir, track_memory=False, capture_logs=False)
    runs = batches(size)
    expected = {"good batch": None, "bad first": 0, "bad last": size - 1}
    samples: dict[str, list[float]] = {label: [] for label in VARIANTS}
    for index in range(rounds + 1):  # the first round warms up
        order = VARIANTS[index % len(VARIANTS) :] + VARIANTS[: index % len(VARIANTS)]
        for label in order:
            start = time.perf_counter_ns()
            try:
                h.run(runs[label])
                found = None
            except hk.StageError as error:
                found = error.request_index
            elapsed = (time.perf_counter_ns() - start) / 1e6
            if found != expected[label]:
                raise RuntimeError(f"{label}: the failure named request {found}, not {expected[label]}")
            if index:
                samples[label].append(elapsed)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _new_users import ranker_dir

    with tempfile.TemporaryDirectory() as root:
        model_dir = str(ranker_dir(Path(root) / "recs", base="handlerkit"))
        for size in (8, 64):
            samples = measure(model_dir, size, args.rounds)
            base = statistics.median(samples["good batch"])
            print(f"ranker, batch of {size}, {args.rounds} rounds (ms per h.run, median; ratio to the good batch)")
            for label in VARIANTS:
                median = statistics.median(samples[label])
                print(f"  {label:<11} {median:8.2f} ms   x{median / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
