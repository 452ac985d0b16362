"""Harness overhead: ``Harness.run`` against a bare ``handle``, side by side in one run.

Each round runs the bare call and one call of each harness variant back to back, in an order
that rotates from round to round, so machine noise hits all alike. A variant's overhead is the
median of its per-round differences (harness - bare), which cancels the drift of a shared
machine, divided by the median bare time. Targets (issue 3):

* fixture classifier, batch 1, memory tracking off ........... <= 3 %
* resnet18 (random weights), batch 1, memory tracking off ..... <= 1 %
* either model with everything on (memory, logs) .............. <= 5 %

"Bare" is what TorchServe's worker does per batch: decode the requests, bind them to the
context, call ``handler.handle(data, context)``.

Usage: python benchmarks/harness_overhead.py [--rounds 300] [--skip-resnet]
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

import handlerkit as hk
from handlerkit.cli import demo_paths


def resnet18_model_dir(root: str) -> str:
    """A model dir with torchvision's resnet18 (random weights) as modelFile + state_dict."""
    import torchvision

    model_dir = os.path.join(root, "resnet18")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "model.py"), "w") as f:
        f.write(
            "import torchvision\n\n\n"
            "class ResNet18(torchvision.models.ResNet):\n"
            "    def __init__(self):\n"
            "        super().__init__(torchvision.models.resnet.BasicBlock, [2, 2, 2, 2])\n"
        )
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), os.path.join(model_dir, "model.pt"))
    return model_dir


VARIANTS = (
    # (label, Harness options, which target applies)
    ("memory off", {"track_memory": False}, "off"),
    ("everything on", {"track_memory": True, "capture_logs": True}, "on"),
    ("memory and logs off", {"track_memory": False, "capture_logs": False}, None),
)


def measure(model_dir: str, image: str, rounds: int, warmup: int, block: int = 3) -> tuple[float, dict[str, list[float]]]:
    """Median ms of bare handle, and per variant the per-round extra ms of Harness.run.

    Every round runs the bare call and each harness variant, in an order that rotates from
    round to round, each as a block of ``block + 1`` calls whose first is dropped (so every
    timed call follows a call of its own kind); a variant's extra is the median of its block
    minus the bare block's median in the same round.
    """
    contexts, callers = [], []
    bare_ctx = hk.MockContext(model_dir=model_dir, model_file="model.py", model_pt_file="model.pt", gpu_id=None)
    bare = hk.handlers.ImageClassifier()
    bare.initialize(bare_ctx)
    batch = hk.batch(hk.Request.from_file(image))

    def run_bare() -> None:
        batch.bind(bare_ctx)
        bare.handle(batch.data, bare_ctx)

    callers.append(run_bare)
    contexts.append(bare_ctx)
    for _, options, _ in VARIANTS:
        ctx = hk.MockContext(model_dir=model_dir, model_file="model.py", model_pt_file="model.pt", gpu_id=None)
        harness = hk.Harness("image_classifier", ctx, **options)
        harness.initialize()
        callers.append(lambda harness=harness: harness.run(batch))
        contexts.append(ctx)

    for _ in range(warmup):
        for call in callers:
            call()
    samples: list[list[float]] = [[] for _ in callers]
    n = len(callers)
    for i in range(rounds):
        for k in range(n):
            j = (i + k) % n
            # A short block of the same call: the first one follows a different call and is
            # dropped, so every timed call follows its own kind, as in a serving loop.
            times = []
            for _ in range(block + 1):
                t0 = time.perf_counter_ns()
                callers[j]()
                times.append(time.perf_counter_ns() - t0)
            samples[j].append(statistics.median(times[1:]) / 1e6)
        for ctx in contexts:  # the recording metrics stores grow with every call; keep them small
            ctx.metrics.clear()
    bare_ms = samples[0]
    extras = {label: [h - b for h, b in zip(samples[j + 1], bare_ms)] for j, (label, _, _) in enumerate(VARIANTS)}
    return statistics.median(bare_ms), extras


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    fixture_dir, images = demo_paths()
    image = next(p for p in images if p.endswith("circle.png"))
    cases = [("fixture classifier", fixture_dir, {"off": 0.03, "on": 0.05})]
    tmp = tempfile.TemporaryDirectory()
    if not args.skip_resnet:
        cases.append(("resnet18 (random weights)", resnet18_model_dir(tmp.name), {"off": 0.01, "on": 0.05}))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds, batch 1")
    print("overhead = median over rounds of (harness - bare) / median bare; p25..p75 of the same differences")
    print(f"{'model':26} {'harness options':20} {'bare ms':>8} {'overhead':>9} {'us/run':>7} {'p25..p75 us':>13} {'target':>7}")
    failed = False
    for name, model_dir, targets in cases:
        bare_ms, extras = measure(model_dir, image, args.rounds, args.warmup)
        for label, _, which in VARIANTS:
            extra = sorted(extras[label])
            median = statistics.median(extra)
            q25, q75 = extra[len(extra) // 4], extra[(3 * len(extra)) // 4]
            target = targets.get(which) if which else None
            overhead = median / bare_ms
            ok = target is None or overhead <= target
            failed |= not ok
            shown = "-" if target is None else f"{target:.0%}"
            print(
                f"{name:26} {label:20} {bare_ms:8.3f} {overhead:+9.2%} {median * 1000:7.0f} "
                f"{f'{q25 * 1000:.0f}..{q75 * 1000:.0f}':>13} {shown:>7}{'' if ok else '  MISSED'}"
            )
    tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
