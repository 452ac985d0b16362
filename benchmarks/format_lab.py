"""The format lab (``h.compare_formats``) on the fixture classifier and resnet18, and its own overhead.

For each model (the fixture classifier on the fixture images; resnet18 with random weights, seed
0, on 1280x960 JPEGs, as ``builtin_vs_torchserve.py`` makes them) the lab's report gives every
format's steady-state median (timed side by side, rotating order), its speed-up over eager and
its first call. Beside it, the lab's own overhead: the lab's wall time against a plain script
that does the same work it must do (export and load each format, its first call, a run of the
handler with it, the three batch sizes on it and on eager, the warm-up and timed calls),
alternating, R rounds each. Target (issue 21): overhead <= 10 %.

Usage: python benchmarks/format_lab.py [--rounds 3] [--repeat 20] [--formats eager,torchscript,onnx,export]
Exit status 1 when the overhead target is missed or a format's answers disagree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]
TARGET_OVERHEAD = 0.10


def plain(h: Any, batch: Any, formats: list[str], repeat: int, warmup: int, workdir: str) -> None:
    """The work the lab must do, written plainly: no report, no checks beyond running it."""
    import torch

    from handlerkit.diagnostics.format_lab.export import make

    handler, context = h.handler, h.context
    batch.bind(context)
    pre = handler.preprocess(batch.data)
    eager = handler.model
    models = {}
    try:
        for fmt in formats:
            made = eager if fmt == "eager" else make(fmt, eager, (pre,), workdir, handler).model
            models[fmt] = made
            with torch.inference_mode():
                made(pre)  # the first call
            handler.model = made
            handler.handle(batch.data, context)  # the answers, through the handler's own stages
            with torch.inference_mode():
                for rows in (pre[:1], pre, torch.cat([pre, pre[:1]])):  # the batch sizes, against eager
                    made(rows), eager(rows)
        with torch.inference_mode():
            for r in range(warmup + repeat):
                order = formats[r % len(formats) :] + formats[: r % len(formats)]
                for fmt in order:
                    start = time.perf_counter()
                    models[fmt](pre)
                    time.perf_counter() - start
    finally:
        handler.model = eager


def model_dirs(tmp: str) -> list[tuple[str, str, Any]]:
    import handlerkit as hk
    from builtin_vs_torchserve import photo_jpegs
    from harness_overhead import resnet18_model_dir

    images = ROOT / "fixtures" / "images"
    fixture = hk.batch(*(hk.Request.from_file(images / f"{n}.png") for n in ("circle", "square", "star")))
    photos = hk.batch(*(hk.Request.from_bytes(data, "image/jpeg") for data in photo_jpegs(n=4)))
    return [
        ("fixture classifier", str(ROOT / "fixtures" / "models" / "image_classifier"), fixture),
        ("resnet18", resnet18_model_dir(tmp), photos),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--formats", default="eager,torchscript,onnx,export")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch

    import handlerkit as hk

    torch.set_num_threads(2)
    formats = args.formats.split(",")
    ok = True
    with tempfile.TemporaryDirectory(prefix="handlerkit-format-lab-") as tmp:
        for name, model_dir, batch in model_dirs(tmp):
            h = hk.Harness.open(model_dir, handler="image_classifier")
            h.initialize()
            lab_s, plain_s, report = [], [], None
            for r in range(args.rounds):
                for which in ("lab", "plain") if r % 2 == 0 else ("plain", "lab"):
                    workdir = tempfile.mkdtemp(dir=tmp)
                    start = time.perf_counter()
                    if which == "lab":
                        report = h.compare_formats(
                            batch, formats=formats, repeat=args.repeat, warmup=args.warmup, directory=workdir, progress=False
                        )
                        lab_s.append(time.perf_counter() - start)
                    else:
                        plain(h, batch, formats, args.repeat, args.warmup, workdir)
                        plain_s.append(time.perf_counter() - start)
            assert report is not None
            overhead = statistics.median(lab_s) / statistics.median(plain_s) - 1
            eager = report.row("eager").steady.median
            print(f"\n{name} ({len(batch)} requests, {os.cpu_count()} CPUs, torch {torch.__version__.split('+')[0]})")
            print(f"{'format':12} {'answers':>8} {'steady ms':>10} {'vs eager':>9} {'first call ms':>14} {'export s':>9}")
            for row in report.rows:
                steady = row.steady.median if row.steady else float("nan")
                agree = "agree" if row.answers_agree else "DIFFER" if row.exported else "failed"
                ok &= bool(row.answers_agree)
                export = f"{row.export_s:9.2f}" if row.export_s is not None else f"{'-':>9}"
                print(f"{row.format:12} {agree:>8} {steady:10.3f} {eager / steady:8.2f}x {row.first_call_ms or 0:14.1f} {export}")
            met = overhead <= TARGET_OVERHEAD
            ok &= met
            print(f"lab {statistics.median(lab_s):.2f} s vs the same work done plainly {statistics.median(plain_s):.2f} s "
                  f"(medians of {args.rounds}): overhead {overhead:+.1%} (target <= {TARGET_OVERHEAD:.0%}){'' if met else '  MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
