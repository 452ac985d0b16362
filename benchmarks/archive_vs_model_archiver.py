"""Building a .mar: handlerkit.archive.build against torch-model-archiver 0.12, side by side.

The same inputs for both: a 500 MB weights file (a state_dict holding one random float32
tensor, saved with ``torch.save``), a small handler that memory-maps it, ``model-config.yaml``
and a 10 MB ``vocab.txt`` (an extra file: text, which compresses). Each round builds the archive with each tool, in an order that rotates
from round to round, each in its own ``python`` process started the same way (the archiver is
its console script; handlerkit is ``python -c "...build(...)"``), so both pay the interpreter's
start. The weights are read once before timing, so both read them from the page cache.

Reported, per archive format (``default``: a zip ``.mar``; ``tgz``: a ``.tar.gz``): each
tool's median build time and archive size, and the median over rounds of the per-round ratio
archiver time / handlerkit time (p25..p75 shows the spread). Then the checks:
the two manifests are equal but for ``createdOn``, the archives hold the same files, and the
handlerkit archive opens in handlerkit (``MockContext.from_mar``) and its handler, run by the
Harness, reads every weight (the tensor's sum matches). Serving it under the real TorchServe
is tests/test_archive_torchserve.py's job.

Target (issue 12): build >= 5x faster than torch-model-archiver.

Usage: python benchmarks/archive_vs_model_archiver.py [--size-mb 500] [--rounds 3]
       [--formats default,tgz] (also no-archive)
Exit status 1 when the target is missed or a check fails; 2 when torch-model-archiver is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVER = Path(sys.executable).parent / "torch-model-archiver"
TARGET = 5.0
VOCAB_MB = 10

HANDLER = '''\
"""Memory-maps the weights and answers with the sum of every weight (the benchmark's load check)."""
import os

import torch


class Weights:
    def initialize(self, context):
        model_dir = context.system_properties["model_dir"]
        path = os.path.join(model_dir, context.manifest["model"]["serializedFile"])
        self.state = torch.load(path, mmap=True, weights_only=True)

    def handle(self, data, context):
        total = float(sum(t.double().sum() for t in self.state.values()))
        return [total for _ in data]
'''


def make_inputs(folder: Path, size_mb: int, vocab_mb: int = VOCAB_MB) -> tuple[Path, float]:
    """weights.pt (``size_mb`` MB of random float32), handler.py, model-config.yaml, vocab.txt
    (``vocab_mb`` MB of words); and the weights' sum."""
    import random

    import torch

    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(size_mb * 1_000_000 // 4, generator=generator)
    torch.save({"weight": weights}, folder / "weights.pt")
    (folder / "handler.py").write_text(HANDLER)
    (folder / "model-config.yaml").write_text("batchSize: 1\nresponseTimeout: 300\n")
    rng = random.Random(0)
    syllables = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze", "##s", "##ing", "##ed"]
    words, size = [], 0
    while size < vocab_mb * 1_000_000:
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        words.append(word)
        size += len(word) + 1
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    return folder, float(weights.double().sum())


def archiver_command(src: Path, out: Path, fmt: str) -> list[str]:
    return [str(ARCHIVER), "--model-name", "big", "--version", "1.0", "--serialized-file", str(src / "weights.pt"),
            "--handler", str(src / "handler.py"), "--config-file", str(src / "model-config.yaml"),
            "--extra-files", str(src / "vocab.txt"), "--export-path", str(out), "--archive-format", fmt,
            "--force"]  # fmt: skip


def handlerkit_command(src: Path, out: Path, fmt: str) -> list[str]:
    code = (
        "from handlerkit.archive import build; "
        f"build(None, {str(out)!r}, model_name='big', version='1.0', serialized_file={str(src / 'weights.pt')!r}, "
        f"handler={str(src / 'handler.py')!r}, config_file={str(src / 'model-config.yaml')!r}, "
        f"extra_files=[{str(src / 'vocab.txt')!r}], archive_format={fmt!r}, force=True, progress=False)"
    )
    return [sys.executable, "-c", code]


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def measure(size_mb: int, rounds: int, fmt: str, work: Path, inputs: tuple[Path, float] | None = None) -> dict:
    """Build ``rounds`` times with each tool; returns times, sizes, outputs and the expected sum.

    ``inputs``: those of :func:`make_inputs` to reuse (default: made in ``work``)."""
    src, expected = inputs or make_inputs(work / "inputs", size_mb)
    with open(src / "weights.pt", "rb") as f:  # into the page cache for both
        while f.read(1 << 24):
            pass
    outputs = {"torch-model-archiver": work / "archiver", "handlerkit": work / "handlerkit"}
    for out in outputs.values():
        out.mkdir(parents=True, exist_ok=True)  # the archiver wants an existing export path
    commands = {"torch-model-archiver": archiver_command, "handlerkit": handlerkit_command}
    times: dict[str, list[float]] = {name: [] for name in commands}
    order = list(commands)
    for r in range(rounds):
        for name in order[r % 2:] + order[: r % 2]:
            times[name].append(timed(commands[name](src, outputs[name], fmt)))
    built = {name: next(out.iterdir()) for name, out in outputs.items()}
    return {"times": times, "built": built, "expected": expected, "sizes": {n: size_of(p) for n, p in built.items()},
            "input_bytes": size_of(src)}


def check(result: dict) -> list[str]:
    """Problems with what handlerkit built (empty when it is right)."""
    import handlerkit as hk
    from handlerkit import archive

    problems = []
    ours, theirs = result["built"]["handlerkit"], result["built"]["torch-model-archiver"]
    mine, ref = archive.read_manifest(ours), archive.read_manifest(theirs)
    mine.pop("createdOn"), ref.pop("createdOn")
    if json.dumps(mine) != json.dumps(ref):  # equal, key order included
        problems.append(f"manifests differ: handlerkit {mine} vs archiver {ref}")
    if ours.is_dir():
        files = lambda p: sorted(q.relative_to(p).as_posix() for q in p.rglob("*") if q.is_file())  # noqa: E731
    else:
        files = lambda p: sorted(f.name for f in archive.inspect_archive(p).files)  # noqa: E731
    if files(ours) != files(theirs):
        problems.append(f"files differ: {files(ours)} vs {files(theirs)}")
    ctx = hk.MockContext.from_model_dir(ours)  # a .mar / .tar.gz through MockContext.from_mar
    run = hk.Harness(ctx.manifest["model"]["handler"], ctx).run(hk.batch(hk.Request.json({})))
    if abs(run.output[0] - result["expected"]) > 1e-6 * max(1.0, abs(result["expected"])):
        problems.append(f"the handler read a weights sum of {run.output[0]}, expected {result['expected']}")
    return problems


def report(result: dict, size_mb: int, fmt: str) -> float:
    times, sizes = result["times"], result["sizes"]
    ratios = [a / b for a, b in zip(times["torch-model-archiver"], times["handlerkit"])]
    print(f"\nbuilding a {fmt} archive of a {size_mb} MB weights file + handler + config + {VOCAB_MB} MB vocab.txt "
          f"({len(ratios)} rounds, each tool in its own python process)\n")  # fmt: skip
    print(f"{'tool':<22} {'median s':>9} {'min s':>7} {'archive MB':>11}")
    for name in times:
        print(f"{name:<22} {statistics.median(times[name]):9.2f} {min(times[name]):7.2f} {sizes[name] / 1e6:11.1f}")
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    ratio = statistics.median(ratios)
    print(f"\nspeed-up (archiver / handlerkit, per round): {ratio:.1f}x (p25..p75 {q[0]:.1f}..{q[2]:.1f}), target >= {TARGET:g}x")
    print(f"size: handlerkit {sizes['handlerkit'] / sizes['torch-model-archiver']:.3f} x the archiver's "
          f"(inputs: {result['input_bytes'] / 1e6:.1f} MB)")
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", default="default,tgz", help="comma-separated: default, tgz, no-archive")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    if not ARCHIVER.is_file():
        print(f"no torch-model-archiver next to {sys.executable}: pip install torch-model-archiver==0.12.0")
        return 2
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = sorted(set(formats) - {"default", "tgz", "no-archive"})
    if unknown:
        parser.error(f"unknown formats {unknown}: choose among default, tgz, no-archive")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hk-archive-bench-"))
    failed = False
    try:
        inputs = make_inputs(work / "inputs", args.size_mb)
        for fmt in formats:
            result = measure(args.size_mb, args.rounds, fmt, work / fmt, inputs)
            ratio = report(result, args.size_mb, fmt)
            problems = check(result)
            for problem in problems:
                print(f"CHECK FAILED: {problem}")
            if not problems:
                print("checks: same manifest (but createdOn) and files as the archiver; the archive opens in "
                      "handlerkit and its handler reads every weight")  # fmt: skip
            if ratio < TARGET:
                print(f"TARGET MISSED: {ratio:.1f}x < {TARGET:g}x")
            failed |= bool(problems) or ratio < TARGET
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("HANDLERKIT_PROGRESS", "0")
    sys.exit(main())
