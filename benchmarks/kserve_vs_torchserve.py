"""The same model served by handlerkit's KServe adapter and by real TorchServe 0.12, side by side,
with the same batching.

Both serve the resnet18 (and fixture classifier) ``.mar`` built by the real
``torch-model-archiver`` with TorchServe's own ``ts.torch_handler.image_classifier`` (so the
engines differ, not the handlers), one worker, the same ``batchSize`` and ``maxBatchDelay`` from
the archive's ``model-config.yaml``: TorchServe on its own ``/predictions/<m>`` route, the JPEG
(``fixtures/images/grace_hopper.jpg``) as the raw body; the adapter
(:func:`handlerkit.serving.kserve.start`, ``kserve.ModelServer`` on loopback, batching through
:mod:`handlerkit.serving.frontend`) on KServe's v1 ``/v1/models/<m>:predict`` with
``{"instances": [{"data": <base64 JPEG>}]}`` (``--protocol v2``: a v2 ``infer`` with one
``BYTES`` input), each request read by its own ``kserve`` envelope, a batch's instances handed
to the handler in one call. One request is answered by both first and the predictions must be
equal. The adapter's handler is TorchServe's, subclassed only to append each batch's size to a
file, so its batch sizes can be shown (TorchServe's are its ``PredictionTime`` count).

The method is ``ray_vs_torchserve.py``'s, whose helpers this script uses: closed-loop client
threads, one HTTP connection per request, the engines up at once taking turns over R
alternating rounds, CPU of each engine's processes, pooled throughput ratio with the per-pair
range. ``--ray`` adds handlerkit's Ray Serve adapter to the same rounds (today's Ray figure).

Target (issue 30): on resnet18, 16 clients, batchSize 8, adapter throughput >= 1.0x
TorchServe's, p99 <= 1.5x.

Usage: python benchmarks/kserve_vs_torchserve.py [--rounds 5] [--requests-per-round 128]
       [--clients 16] [--batch 8] [--delay-ms 10] [--models fixture,resnet18] [--protocol v1|v2]
       [--ray]
Exit status 1 when the resnet18 target is missed, the engines' answers differ or a request was
not answered 200; 2 when kserve, torchserve (or Java) or psutil is missing.
"""

from __future__ import annotations

import argparse
import base64
import collections
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ray_vs_torchserve import IMAGE, ROOT, Engine, TorchServeEngine, build_mar, measure, row

TARGET = {"model": "resnet18", "throughput": 1.0, "p99": 1.5}
ADAPTER, TORCHSERVE, RAY = "kserve adapter", "torchserve 0.12", "ray serve adapter"
#: TorchServe's image classifier, recording each batch's size (the adapter's process has no other window).
COUNTED = """import os

from ts.torch_handler.image_classifier import ImageClassifier


class CountedImageClassifier(ImageClassifier):
    def handle(self, data, context):
        with open(os.environ["HK_BENCH_BATCH_SIZES"], "a") as sizes:
            sizes.write(f"{len(data)}\\n")
        return super().handle(data, context)
"""


def kserve_body(protocol: str, image: Path = IMAGE) -> bytes:
    """What every adapter request posts: the image's base64, as a v1 instance or a v2 BYTES input."""
    data = base64.b64encode(image.read_bytes()).decode("ascii")
    if protocol == "v1":
        return json.dumps({"instances": [{"data": data}]}).encode()
    return json.dumps({"id": "bench", "inputs": [{"name": "img", "shape": [1], "datatype": "BYTES", "data": [data]}]}).encode()


class KServeEngine(Engine):
    """handlerkit's KServe adapter: ``kserve.ModelServer`` in a child process on 127.0.0.1.

    Its process is counted by ``measure`` as every child of this process but TorchServe's."""

    label = ADAPTER
    content_type = "application/json"

    def __init__(self, mar: Path, name: str, log: Path, protocol: str) -> None:
        from handlerkit.serving.kserve import start

        super().__init__()
        self.sizes_file = log.with_suffix(".sizes")
        os.environ["HK_BENCH_BATCH_SIZES"] = str(self.sizes_file)  # the child inherits it
        self.server = start(mar, name=name, log=log, timeout=180)
        self.url = f"{self.server.v1_url}:predict" if protocol == "v1" else f"{self.server.v2_url}/infer"
        self.protocol = protocol
        self.body = kserve_body(protocol)
        self.threads = "torch default"
        self._before = 0

    def _sizes(self) -> list[int]:
        return [int(n) for n in self.sizes_file.read_text().split()] if self.sizes_file.exists() else []

    def mark(self) -> None:
        self._before = len(self._sizes())

    def handled(self) -> tuple[list[int] | None, list[float]]:
        return self._sizes()[self._before :], []  # handle not timed in its process

    def stop(self) -> None:
        self.server.stop()


def predictions(url: str, body: bytes, content_type: str, protocol: str | None = None) -> tuple[int, Any]:
    """One request's status and prediction (the top-5 dict): TorchServe's answer as it is
    (``protocol`` None), the adapter's out of its v1 or v2 document."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, doc = resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()[:300]
    if protocol == "v1":
        doc = doc["predictions"][0]
    elif protocol == "v2":
        doc = doc["outputs"][0]["data"][0]
    return status, json.loads(doc) if isinstance(doc, str) else doc


def same_answers(model: str, ours: tuple[int, Any], theirs: tuple[int, Any]) -> bool:
    """Print whether the adapter predicted as TorchServe did; True when equal (and 200)."""
    if ours[0] == theirs[0] == 200 and isinstance(ours[1], dict) and ours[1].keys() == theirs[1].keys() and all(
        abs(ours[1][k] - theirs[1][k]) < 1e-4 for k in ours[1]
    ):
        print(f"{model}: predictions equal (status 200, top {len(ours[1])})")
        return True
    print(f"{model}: ANSWERS DIFFER: adapter {ours[0]} {str(ours[1])[:300]}\n{'':>{len(model) + 16}}torchserve "
          f"{theirs[0]} {str(theirs[1])[:300]}")
    return False


def verdict(model: str, ours: dict[str, Any], ts: dict[str, Any], label: str = "adapter") -> tuple[str, bool]:
    """The comparison line for one engine and model, and whether it missed the target (resnet18 only)."""
    ratio, p99 = ours["req/s"] / ts["req/s"], ours["p99 ms"] / ts["p99 ms"]
    pairs = [a / b for a, b in zip(ours["round req/s"], ts["round req/s"])]
    line = (f"{model}: {label}/TorchServe throughput {ratio:.2f}x (rounds {min(pairs):.2f}..{max(pairs):.2f}), "
            f"p99 {p99:.2f}x")
    if model != TARGET["model"]:
        return line, False
    ok = ratio >= TARGET["throughput"] and p99 <= TARGET["p99"]
    return line + ("  target met" if ok else "  TARGET MISSED (>= 1.0x throughput, <= 1.5x p99)"), not ok


def run_model(name: str, mars: tuple[Path, Path], tmp: Path, args: argparse.Namespace) -> tuple[bool, list[tuple[str, dict]]]:
    """The engines up at once: the answer check, then the alternating rounds."""
    ts_mar, counted_mar = mars
    engines: list[Engine] = []
    ray_started = False
    try:
        engines.append(TorchServeEngine(ts_mar, name, tmp / f"ts-{name}"))
        engines.append(KServeEngine(counted_mar, name, tmp / f"kserve-{name}.log", args.protocol))
        if args.ray:
            import ray
            from ray import serve
            from ray_vs_torchserve import RayEngine, _free_port

            port = _free_port()
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            ray_started = True
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            args.replica_cpus = 2
            engines.append(RayEngine(ts_mar, name, port, args, "torchserve"))
        ts, ours = engines[:2]
        equal = same_answers(name, predictions(ours.url, ours.body or b"", ours.content_type, args.protocol),
                             predictions(ts.url, IMAGE.read_bytes(), ts.content_type))
        measure(engines, args)
        return equal, [(engine.label, row(engine)) for engine in engines]
    finally:
        for engine in engines:
            if not engine.__class__.__name__ == "RayEngine":
                engine.stop()
        if ray_started:
            import ray
            from ray import serve

            try:
                serve.shutdown()
            finally:
                ray.shutdown()
            for engine in engines[2:]:
                engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests-per-round", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="batchSize, for every engine")
    parser.add_argument("--delay-ms", type=int, default=10, help="maxBatchDelay, for every engine")
    parser.add_argument("--models", default="fixture,resnet18")
    parser.add_argument("--protocol", choices=("v1", "v2"), default="v1", help="the adapter's KServe route")
    parser.add_argument("--ray", action="store_true", help="also run handlerkit's Ray Serve adapter in the rounds")
    args = parser.parse_args()
    missing = [m for m in ("kserve", "psutil", "ts", *(["ray"] if args.ray else [])) if importlib.util.find_spec(m) is None]
    if missing:
        print(f"needs kserve, psutil and torchserve: pip install 'handlerkit[kserve,test]' (missing: {missing})",
              file=sys.stderr)
        return 2
    import _ts_server

    if _ts_server.missing_requirements():
        print(f"cannot start TorchServe: {_ts_server.missing_requirements()}", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="hk-kserve-bench-"))
    rows: list[tuple[str, str, dict[str, Any]]] = []
    equal = True
    try:
        store, counted_store = tmp / "store", tmp / "counted"
        store.mkdir()
        counted_store.mkdir()
        (tmp / "counted_image_classifier.py").write_text(COUNTED)
        models = {}
        if "fixture" in args.models:
            models["classifier"] = ROOT / "fixtures" / "models" / "image_classifier"
        if "resnet18" in args.models:
            from harness_overhead import resnet18_model_dir

            models["resnet18"] = Path(resnet18_model_dir(str(tmp)))
        for name, model_dir in models.items():
            mars = (build_mar(name, model_dir, store, args.batch, args.delay_ms),
                    build_mar(name, model_dir, counted_store, args.batch, args.delay_ms,
                              tmp / "counted_image_classifier.py"))
            same, model_rows = run_model(name, mars, tmp, args)
            equal &= same
            rows += [(name, label, r) for label, r in model_rows]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(rows, args, equal)


def report(rows: list[tuple[str, str, dict[str, Any]]], args: argparse.Namespace, equal: bool = True) -> int:
    """The figures and the verdict: 1 when the target is missed or the answers differed."""
    route = "v1 :predict (base64 JPEG instance)" if args.protocol == "v1" else "v2 infer (BYTES base64 JPEG)"
    print(f"\n{args.rounds} alternating rounds x {args.requests_per_round} requests per engine, {args.clients} "
          f"closed-loop clients, batchSize {args.batch}, maxBatchDelay {args.delay_ms} ms, 1 worker, "
          f"{os.cpu_count()} CPUs; TorchServe: /predictions (raw JPEG); adapter: {route}")
    print("cpu: the engine's processes' CPU (cores) in its rounds; idle: its CPU (cores) while another ran")
    print(f"{'model':<11} {'engine':<18} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'cpu':>5} {'idle':>5}  statuses  "
          "batch sizes")
    for model, engine, r in rows:
        print(f"{model:<11} {engine:<18} {r['req/s']:7.1f} {r['p50 ms']:8.1f} {r['p99 ms']:8.1f} {r['cpu']:5.2f} "
              f"{r['idle cpu']:5.2f}  {r['statuses']}  {r['batches']}")
    by = {(m, e): r for m, e, r in rows}
    missed = not equal
    for model in dict.fromkeys(m for m, _, _ in rows):
        line, miss = verdict(model, by[(model, ADAPTER)], by[(model, TORCHSERVE)])
        print(line)
        missed |= miss
        if (model, RAY) in by:
            line, _ = verdict(model, by[(model, RAY)], by[(model, TORCHSERVE)], label="ray adapter")
            print(line.split("  t")[0].split("  T")[0] + "  (the Ray figure, for reference)")
            kserve, ray_ = by[(model, ADAPTER)], by[(model, RAY)]
            print(f"{model}: kserve adapter/ray adapter throughput {kserve['req/s'] / ray_['req/s']:.2f}x, "
                  f"p99 {kserve['p99 ms'] / ray_['p99 ms']:.2f}x")
    if not equal:
        print("the engines' answers differed (above): the figures compare different work")
    failed = sorted({f"{model} {engine}" for model, engine, r in rows if set(r["statuses"]) != {200}})
    if failed:
        print(f"NOT ALL ANSWERED 200: {', '.join(failed)} (statuses above): the figures compare failures")
        missed = True
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
