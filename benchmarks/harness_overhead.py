"""Harness overhead: ``Harness.run`` against a bare ``handle``, side by side in one run.

Each round runs the bare call and the harness call back to back (in alternating order), so
machine noise hits both alike. The overhead is the median of the per-round differences
(harness - bare), which cancels the drift of a shared machine, divided by the median bare
time. Targets (issue 3):

* fixture classifier, batch 1, memory tracking off ........... <= 3 %
* resnet18 (random weights), batch 1, memory tracking off ..... <= 1 %
* either model with everything on (memory, logs) .............. <= 5 %

"Bare" is what TorchServe's worker does per batch: decode the requests, bind them to the
context, call ``handler.handle(data, context)``.

Usage: python benchmarks/harness_overhead.py [--rounds 200] [--skip-resnet]
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


def measure(model_dir: str, image: str, rounds: int, warmup: int, **harness_options: bool) -> tuple[float, float]:
    """Median ms of bare handle, and median per-round extra ms of Harness.run (interleaved)."""
    ctx = hk.MockContext(model_dir=model_dir, model_file="model.py", model_pt_file="model.pt", gpu_id=None)
    bare_ctx = hk.MockContext(model_dir=model_dir, model_file="model.py", model_pt_file="model.pt", gpu_id=None)
    harness = hk.Harness("image_classifier", ctx, **harness_options)
    harness.initialize()
    bare = hk.handlers.ImageClassifier()
    bare.initialize(bare_ctx)
    batch = hk.batch(hk.Request.from_file(image))

    def run_bare() -> None:
        batch.bind(bare_ctx)
        bare.handle(batch.data, bare_ctx)

    def run_harness() -> None:
        harness.run(batch)

    for _ in range(warmup):
        run_bare()
        run_harness()
    bare_ms, harness_ms = [], []
    for i in range(rounds):
        order = ((run_bare, bare_ms), (run_harness, harness_ms))
        for fn, samples in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
        # the recording metrics stores grow with every call; keep them small
        ctx.metrics.clear()
        bare_ctx.metrics.clear()
    extra = [h - b for h, b in zip(harness_ms, bare_ms)]
    return statistics.median(bare_ms), statistics.median(extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    fixture_dir, images = demo_paths()
    image = next(p for p in images if p.endswith("circle.png"))
    cases = [("fixture classifier", fixture_dir, 0.03, 0.05)]
    tmp = tempfile.TemporaryDirectory()
    if not args.skip_resnet:
        cases.append(("resnet18 (random weights)", resnet18_model_dir(tmp.name), 0.01, 0.05))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds, batch 1")
    print(f"{'model':28} {'harness options':24} {'bare ms':>9} {'harness ms':>11} {'overhead':>9} {'us/run':>7} {'target':>7}")
    failed = False
    for name, model_dir, target_off, target_on in cases:
        for label, options, target in (
            ("memory off", {"track_memory": False}, target_off),
            ("everything on", {"track_memory": True, "capture_logs": True}, target_on),
            ("memory and logs off", {"track_memory": False, "capture_logs": False}, None),
        ):
            bare_ms, extra_ms = measure(model_dir, image, args.rounds, args.warmup, **options)
            harness_ms = bare_ms + extra_ms
            overhead = extra_ms / bare_ms
            ok = target is None or overhead <= target
            failed |= not ok
            shown = "-" if target is None else f"{target:.0%}"
            print(
                f"{name:28} {label:24} {bare_ms:9.3f} {harness_ms:11.3f} {overhead:+9.2%} "
                f"{extra_ms * 1000:7.0f} {shown:>7}{'' if ok else '  MISSED'}"
            )
    tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
