"""Harness overhead: ``Harness.run`` against a bare ``handle``, side by side in one run.

Each round runs the bare call and each variant as short blocks, in an order that rotates from
round to round, so machine noise hits all alike. A variant's overhead is the median of its
per-round differences (variant - bare), which cancels the drift of a shared machine, divided
by the median bare time. Targets (issue 3):

* fixture classifier, batch 1, memory tracking off ........... <= 3 %
* resnet18 (random weights), batch 1, memory tracking off ..... <= 1 %
* either model with everything on (memory, logs) .............. <= 5 %
* the Service's own cost on the serving path (issue 30) ....... <= 1 %

The row "Service.handle (serving path)" is ``Service.handle(batch)`` as the servers call it:
bind the batch, enter the model dir's imports, call the entry point. It is built with
``working_dir=None``, which costs per call what a server's ``working_dir="process"`` does (that
one moves into the model dir once, for good, which would move this benchmark's process too).

The reference row "bare + memory per stage" is no harness at all: the bare handler with a
MemoryTracker around each stage, i.e. what an exact per-stage peak costs by itself (a reset of
the kernel's high-water mark and two reads per stage, each a syscall). "memory off, cwd left
alone" is the harness without the model dir as working directory (``working_dir=None``): the
difference to "memory off" is what moving there and back costs per call. The table after it
gives each system call's own cost in a tight loop; next to a model each costs several times
that (measured here: the working directory's four calls, 2 us in a loop, cost 15-25 us a call
next to the fixture classifier; any Python work next to it costs 2-3x its time alone).

"Bare" is what TorchServe's worker does per batch: decode the requests, bind them to the
context, call ``handler.handle(data, context)``. ``Harness.run`` calls that same ``handle``
(since issue 8: an override, micro-batching or an envelope runs as under the server), with the
stage methods reporting to a recorder; before, it ran the three stages itself and skipped
what ``handle`` does around them, which the bare call paid.

Usage: python benchmarks/harness_overhead.py [--rounds 1000] [--resnet-rounds 200] [--skip-resnet]
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
from collections.abc import Callable

import torch

import handlerkit as hk
from handlerkit.cli import demo_paths
from handlerkit.worker.memory import MemoryTracker


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
    # (label, Harness options or None for the reference row, which target applies)
    ("memory off", {"track_memory": False}, "off"),
    ("everything on", {"track_memory": True, "capture_logs": True}, "on"),
    ("memory and logs off", {"track_memory": False, "capture_logs": False}, None),
    # What the model dir as working directory costs (two getcwd and two fchdir per call).
    ("memory off, cwd left alone", {"track_memory": False, "working_dir": None}, None),
    # No harness: bare handle with a MemoryTracker around each stage. What exact per-stage
    # peak memory costs by itself (a reset and two reads of /proc per stage).
    ("bare + memory per stage", None, None),
    # No harness either: the front door the servers call, Service.handle (see the docstring).
    ("Service.handle (serving path)", {"service": True}, "service"),
)


class _MemoryPerStage(hk.handlers.ImageClassifier):
    """The built-in classifier with a MemoryTracker around each stage (the reference row)."""

    def preprocess(self, data):  # type: ignore[no-untyped-def]
        with MemoryTracker():
            return super().preprocess(data)

    def inference(self, data, *args, **kwargs):  # type: ignore[no-untyped-def]
        with MemoryTracker():
            return super().inference(data, *args, **kwargs)

    def postprocess(self, data):  # type: ignore[no-untyped-def]
        with MemoryTracker():
            return super().postprocess(data)


def measure(model_dir: str, image: str, rounds: int, warmup: int, block: int = 3) -> tuple[float, dict[str, list[float]]]:
    """Median ms of bare handle, and per variant the per-round extra ms over it.

    Every round runs the bare call and each variant, in an order that rotates from round to
    round, each as a block of ``block + 1`` calls whose first is dropped (so every timed call
    follows a call of its own kind); a variant's extra is the median of its block minus the
    bare block's median in the same round.
    """
    batch = hk.batch(hk.Request.from_file(image))
    contexts, callers = [], []

    def context() -> hk.MockContext:
        ctx = hk.MockContext(model_dir=model_dir, model_file="model.py", model_pt_file="model.pt", gpu_id=None)
        contexts.append(ctx)
        return ctx

    def handle_of(handler_class: type) -> Callable[[], object]:
        ctx = context()
        handler = handler_class()
        handler.initialize(ctx)

        def run_bare() -> None:  # what TorchServe's worker does per batch
            batch.bind(ctx)
            handler.handle(batch.data, ctx)

        return run_bare

    callers.append(handle_of(hk.handlers.ImageClassifier))
    for _, options, _ in VARIANTS:
        if options is None:
            callers.append(handle_of(_MemoryPerStage))
            continue
        if options.get("service"):
            service = hk.Service("image_classifier", context(), working_dir=None)
            service.initialize()
            callers.append(lambda service=service: service.handle(batch))
            continue
        harness = hk.Harness("image_classifier", context(), **options)
        harness.initialize()
        callers.append(lambda harness=harness: harness.run(batch))

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
    parser.add_argument("--rounds", type=int, default=1000, help="rounds for the fixture classifier (~2 ms a call)")
    parser.add_argument("--resnet-rounds", type=int, default=200, help="rounds for resnet18 (~30 ms a call)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    fixture_dir, images = demo_paths()
    image = next(p for p in images if p.endswith("circle.png"))
    cases = [("fixture classifier", fixture_dir, args.rounds, {"off": 0.03, "on": 0.05, "service": 0.01})]
    tmp = tempfile.TemporaryDirectory()
    if not args.skip_resnet:
        targets = {"off": 0.01, "on": 0.05, "service": 0.01}
        cases.append(("resnet18 (random weights)", resnet18_model_dir(tmp.name), args.resnet_rounds, targets))

    rounds = ", ".join(f"{name}: {n} rounds" for name, _, n, _ in cases)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1; {rounds}")
    print("overhead = median over rounds of (variant - bare) / median bare; p25..p75 of the same differences")
    print(f"{'model':26} {'variant':30} {'bare ms':>8} {'overhead':>9} {'us/run':>7} {'p25..p75 us':>13} {'target':>7}")
    failed = False
    for name, model_dir, n_rounds, targets in cases:
        bare_ms, extras = measure(model_dir, image, n_rounds, args.warmup)
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
                f"{name:26} {label:30} {bare_ms:8.3f} {overhead:+9.2%} {median * 1000:7.0f} "
                f"{f'{q25 * 1000:.0f}..{q75 * 1000:.0f}':>13} {shown:>7}{'' if ok else '  MISSED'}"
            )
        # Per round: everything on, minus bare with a MemoryTracker per stage.
        beyond = statistics.median(on - mem for on, mem in zip(extras["everything on"], extras["bare + memory per stage"]))
        print(
            f"{name:26} {'  everything on, beyond exact per-stage memory:':56} {beyond / bare_ms:+9.2%} {beyond * 1000:7.0f}"
        )
    tmp.cleanup()
    print()
    print(syscall_table())
    return 1 if failed else 0


def syscall_table(n: int = 20000) -> str:
    """What each system call the harness makes per stage or per call costs on its own here (a
    tight loop of n; next to a model each costs more: its caches are the model's too)."""
    import resource

    from handlerkit.worker import memory

    here = os.getcwd()
    fd = os.open(here, os.O_RDONLY)
    calls = [
        ("reset the high-water mark (write /proc/self/clear_refs)", "memory on: each stage", memory._reset_hwm),
        ("RSS at a stage's start (read /proc/self/statm)", "memory on: each stage", memory.rss_bytes),
        ("peak: getrusage(RUSAGE_SELF)", "memory on: each stage", lambda: resource.getrusage(resource.RUSAGE_SELF)),
        ("peak: read /proc/self/status (the fallback)", "where getrusage is not exact", memory._hwm_and_rss),
        ("getcwd()", "twice a call", os.getcwd),
        ("fchdir()", "twice a call", lambda: os.fchdir(fd)),
    ]
    rows = [f"{'system call':58} {'when':30} {'us':>6}"]
    for label, when, call in calls:
        for _ in range(200):
            call()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            call()
        rows.append(f"{label:58} {when:30} {(time.perf_counter_ns() - t0) / n / 1000:6.2f}")
    os.close(fd)
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
