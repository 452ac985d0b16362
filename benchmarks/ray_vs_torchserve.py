"""The same model served by handlerkit's Ray Serve adapter and by real TorchServe 0.12, side by side.

Both serve one ``.mar`` built by the real ``torch-model-archiver`` with TorchServe's own
``ts.torch_handler.image_classifier`` (so the engines differ, not the handlers), one worker /
one replica, the same ``batchSize`` and ``maxBatchDelay``. The load is closed loop: C client
threads each send their share of N requests (one HTTP connection per request, loopback), each
the same JPEG (``fixtures/images/grace_hopper.jpg``). After a warm-up, it reports requests/s,
p50/p99 latency and the batch sizes the handler got (Ray: every batch, from the replica;
TorchServe: requests / ``PredictionTime`` records in ``model_metrics.log``, so a mean only).

Models: the fixture classifier (small CNN: engine overhead dominates) and resnet18 with random
weights (inference dominates). Target (issue 13): on resnet18, adapter throughput >= 0.9x
TorchServe's, p99 <= 1.5x. The engines run one after the other, never together, on the same cores.

Usage: python benchmarks/ray_vs_torchserve.py [--requests 256] [--clients 16] [--batch 8]
       [--delay-ms 10] [--models fixture,resnet18]
Exit status 1 when the resnet18 target is missed; 2 when ray or torchserve is missing.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
IMAGE = ROOT / "fixtures" / "images" / "grace_hopper.jpg"
HANDLER = "ts.torch_handler.image_classifier"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_mar(name: str, model_dir: Path, store: Path, batch: int, delay_ms: int) -> Path:
    """A .mar by the real archiver, with a model-config.yaml giving both engines the same batching."""
    import _ts_server

    config = store / f"{name}-config.yaml"
    config.write_text(f"minWorkers: 1\nmaxWorkers: 1\nbatchSize: {batch}\nmaxBatchDelay: {delay_ms}\nresponseTimeout: 120\n")
    extra = [model_dir / "index_to_name.json"] if (model_dir / "index_to_name.json").exists() else []
    return _ts_server.archive(name=name, version="1.0", model_file=model_dir / "model.py",
                              serialized_file=model_dir / "model.pt", handler=Path("image_classifier"),
                              extra_files=extra, config_file=config, export_path=store)


def load(url: str, requests: int, clients: int) -> tuple[float, list[float], collections.Counter]:
    """Closed loop: ``clients`` threads, ``requests`` in all; wall time, latencies (ms), statuses."""
    body = IMAGE.read_bytes()

    def one() -> tuple[float, int]:
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "image/jpeg"}, method="POST")
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            exc.read()
            status = exc.code
        return (time.perf_counter() - start) * 1000, status

    def client(k: int) -> list[tuple[float, int]]:
        return [one() for _ in range(k, requests, clients)]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for chunk in pool.map(client, range(clients)) for r in chunk]
    wall = time.perf_counter() - start
    return wall, [ms for ms, _ in results], collections.Counter(s for _, s in results)


def summary(wall: float, latencies: list[float], statuses: collections.Counter, sizes: str) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "req/s": len(latencies) / wall,
        "p50 ms": statistics.median(ordered),
        "p99 ms": ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))],
        "statuses": dict(statuses),
        "batches": sizes,
    }


def run_ray(mar: Path, name: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from handlerkit.serving.ray import app

    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        handle = serve.run(app(mar, handler=HANDLER, num_cpus=args.replica_cpus), name=name, route_prefix="/")
        url = f"http://127.0.0.1:{port}/predictions/{name}"
        load(url, args.warmup, args.clients)
        before = len(handle.stats.remote().result()["batch_sizes"])
        result = load(url, args.requests, args.clients)
        sizes = handle.stats.remote().result()["batch_sizes"][before:]
        hist = ", ".join(f"{k}:{v}" for k, v in sorted(collections.Counter(sizes).items()))
        threads = handle.stats.remote().result()["torch_threads"]
        return summary(*result, f"mean {statistics.mean(sizes):.2f} ({hist}); torch threads {threads}")
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def run_torchserve(mar: Path, name: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    import _ts_server

    ts = _ts_server.TorchServe(root=root, models={name: mar.name}, model_store=mar.parent)
    try:
        ts.start(timeout=180)
        url = f"http://127.0.0.1:{ts.inference_port}/predictions/{name}"
        metrics = ts.logs / "model_metrics.log"

        def batches() -> int:
            return metrics.read_text().count("PredictionTime") if metrics.exists() else 0

        load(url, args.warmup, args.clients)
        time.sleep(1.0)  # the worker's metrics reach the log asynchronously
        before = batches()
        result = load(url, args.requests, args.clients)
        time.sleep(2.0)
        count = batches() - before
        sizes = f"mean {args.requests / count:.2f} ({count} batches)" if count > 0 else "(no PredictionTime records)"
        return summary(*result, sizes)
    finally:
        ts.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=10)
    parser.add_argument("--models", default="fixture,resnet18")
    parser.add_argument("--replica-cpus", type=float, default=2,
                        help="the replica's num_cpus (Ray sets its OMP_NUM_THREADS to it; TorchServe's worker "
                        "uses torch's default, the core count)")
    args = parser.parse_args()
    try:
        import _ts_server
        import ray  # noqa: F401
    except ImportError as exc:
        print(f"needs ray[serve] and torchserve: pip install 'handlerkit[ray,test]' ({exc})", file=sys.stderr)
        return 2
    if _ts_server.missing_requirements():
        print(f"cannot start TorchServe: {_ts_server.missing_requirements()}", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="hk-ray-bench-"))
    rows: list[tuple[str, str, dict[str, Any]]] = []
    try:
        store = tmp / "store"
        store.mkdir()
        models = {}
        if "fixture" in args.models:
            models["classifier"] = ROOT / "fixtures" / "models" / "image_classifier"
        if "resnet18" in args.models:
            from harness_overhead import resnet18_model_dir

            models["resnet18"] = Path(resnet18_model_dir(str(tmp)))
        for name, model_dir in models.items():
            mar = build_mar(name, model_dir, store, args.batch, args.delay_ms)
            rows.append((name, "torchserve 0.12", run_torchserve(mar, name, tmp / f"ts-{name}", args)))
            rows.append((name, "ray serve adapter", run_ray(mar, name, args)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n{args.requests} requests, {args.clients} closed-loop clients, batchSize {args.batch}, "
          f"maxBatchDelay {args.delay_ms} ms, 1 worker/replica, {os.cpu_count()} CPUs")
    print(f"{'model':<11} {'engine':<18} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}  statuses  batch sizes")
    for model, engine, r in rows:
        print(f"{model:<11} {engine:<18} {r['req/s']:7.1f} {r['p50 ms']:8.1f} {r['p99 ms']:8.1f}  "
              f"{r['statuses']}  {r['batches']}")
    missed = False
    by = {(m, e.split()[0]): r for m, e, r in rows}
    for model in models:
        ts, rr = by[(model, "torchserve")], by[(model, "ray")]
        ratio, p99 = rr["req/s"] / ts["req/s"], rr["p99 ms"] / ts["p99 ms"]
        verdict = ""
        if model == "resnet18":
            ok = ratio >= 0.9 and p99 <= 1.5
            missed |= not ok
            verdict = "  target met" if ok else "  TARGET MISSED (>= 0.9x throughput, <= 1.5x p99)"
        print(f"{model}: adapter/TorchServe throughput {ratio:.2f}x, p99 {p99:.2f}x{verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
