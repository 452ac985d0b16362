"""The same model served by handlerkit's Ray Serve adapter and by real TorchServe 0.12, side by side.

Both serve one ``.mar`` built by the real ``torch-model-archiver`` with TorchServe's own
``ts.torch_handler.image_classifier`` (so the engines differ, not the handlers), one worker /
one replica, the same ``batchSize`` and ``maxBatchDelay``. The load is closed loop: C client
threads each send their share of the round's requests (one HTTP connection per request,
loopback), each the same JPEG (``fixtures/images/grace_hopper.jpg``).

Both engines are up at once and take turns: R rounds each, alternating (TorchServe first in
odd pairs, Ray first in even ones), so the drift of a shared machine hits both alike; the idle
engine's CPU use during the other's rounds is measured and printed. Reported per engine over
all its rounds: requests/s, p50/p99 latency, the batch sizes the handler got and the time
``handle`` took per batch (Ray: from the replica; TorchServe: its ``PredictionTime`` records),
and "busy", the share of wall time the handler ran. The throughput ratio is pooled (all
requests / all wall time, per engine), with the per-pair ratios' range beside it.

Models: the fixture classifier (small CNN: engine overhead dominates) and resnet18 with random
weights (inference dominates); ``--models echo`` adds a handler that answers without looking
(only the engines' own cost per request is left). Target (issue 13): on resnet18, adapter throughput >= 0.9x
TorchServe's, p99 <= 1.5x.

Ray runs as installed (its HTTP proxy actor) unless ``--ray-high-throughput``, which starts
the local Ray instance in Ray Serve's documented high-throughput mode
(``RAY_SERVE_ENABLE_HA_PROXY=1``, ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: HAProxy in front,
replicas serving HTTP directly; needs the ``haproxy`` binary). ``--serve-batch`` adds the
adapter with Ray's own ``@serve.batch`` as a third engine.

Usage: python benchmarks/ray_vs_torchserve.py [--rounds 5] [--requests-per-round 128]
       [--clients 16] [--batch 8] [--delay-ms 10] [--models fixture,resnet18[,echo]]
       [--ray-high-throughput] [--serve-batch]
Exit status 1 when the resnet18 target is missed; 2 when ray, torchserve or haproxy is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import importlib.util
import os
import re
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
#: A handler that answers "ok" per request without looking at it: what is left is the engine.
ECHO = """def handle(data, context):
    return None if data is None else ["ok"] * len(data)
"""
HIGH_THROUGHPUT_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_mar(name: str, model_dir: Path, store: Path, batch: int, delay_ms: int, handler: Path | None = None) -> Path:
    """A .mar by the real archiver, with a model-config.yaml giving both engines the same batching
    (TorchServe's image_classifier unless ``handler`` names a handler file)."""
    import _ts_server

    config = store / f"{name}-config.yaml"
    config.write_text(f"minWorkers: 1\nmaxWorkers: 1\nbatchSize: {batch}\nmaxBatchDelay: {delay_ms}\nresponseTimeout: 120\n")
    extra = [model_dir / "index_to_name.json"] if (model_dir / "index_to_name.json").exists() else []
    return _ts_server.archive(name=name, version="1.0", model_file=model_dir / "model.py",
                              serialized_file=model_dir / "model.pt", handler=handler or Path("image_classifier"),
                              extra_files=extra, config_file=config, export_path=store)


def load(url: str, requests: int, clients: int, body: bytes | None = None,
         content_type: str = "image/jpeg") -> tuple[float, list[float], collections.Counter]:
    """Closed loop: ``clients`` threads, ``requests`` in all, each posting ``body`` (the JPEG by
    default); wall time, latencies (ms), statuses (a request with no answer counts under its
    error's name, ``TimeoutError``)."""
    body = IMAGE.read_bytes() if body is None else body

    def one() -> tuple[float, int | str]:
        req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            exc.read()
            status = exc.code
        except (urllib.error.URLError, OSError) as exc:  # no answer at all (timed out, reset): counted, not fatal
            status = type(getattr(exc, "reason", exc)).__name__
        return (time.perf_counter() - start) * 1000, status

    def client(k: int) -> list[tuple[float, int | str]]:
        return [one() for _ in range(k, requests, clients)]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for chunk in pool.map(client, range(clients)) for r in chunk]
    wall = time.perf_counter() - start
    return wall, [ms for ms, _ in results], collections.Counter(s for _, s in results)


def _cpu_seconds(pids: set[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class Engine:
    """One served model: its URL, its processes, and what its handler reported."""

    label = ""
    body: bytes | None = None  # what each request posts (None: the JPEG, see load)
    content_type = "image/jpeg"

    def __init__(self) -> None:
        self.url = ""
        self.walls: list[float] = []
        self.latencies: list[float] = []
        self.statuses: collections.Counter = collections.Counter()
        self.cpu = 0.0  # CPU seconds this engine's processes used in its own rounds
        self.idle_cpu = 0.0  # ... and in the other engines' rounds
        self.idle_wall = 0.0

    def pids(self) -> set[int]:
        """This engine's own processes (Ray's are counted together: :func:`ray_pids`)."""
        return set()

    def mark(self) -> None:
        """Remember where the handler's records stand (after warm-up)."""

    def handled(self) -> tuple[list[int] | None, list[float]]:
        """Batch sizes (None when only a count is known) and handle times since :meth:`mark`."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class TorchServeEngine(Engine):
    label = "torchserve 0.12"

    def __init__(self, mar: Path, name: str, root: Path) -> None:
        import _ts_server

        super().__init__()
        self.ts = _ts_server.TorchServe(root=root, models={name: mar.name}, model_store=mar.parent)
        self.ts.start(timeout=180)
        self.url = f"http://127.0.0.1:{self.ts.inference_port}/predictions/{name}"
        self._before = 0

    def pids(self) -> set[int]:
        import psutil

        try:
            root = psutil.Process(self.ts.process.pid)  # the launcher; the JVM and workers below it
            return {root.pid, *(p.pid for p in root.children(recursive=True))}
        except (psutil.Error, AttributeError):
            return set()

    def _handle_ms(self) -> list[float]:  # one PredictionTime record per batch the worker ran
        metrics = self.ts.logs / "model_metrics.log"
        text = metrics.read_text() if metrics.exists() else ""
        return [float(ms) for ms in re.findall(r"PredictionTime\.\w+:([0-9.]+)", text)]

    def mark(self) -> None:
        time.sleep(1.0)  # the worker's metrics reach the log asynchronously
        self._before = len(self._handle_ms())

    def handled(self) -> tuple[list[int] | None, list[float]]:
        time.sleep(2.0)
        return None, self._handle_ms()[self._before:]

    def stop(self) -> None:
        self.ts.stop()


class RayEngine(Engine):
    def __init__(self, mar: Path, name: str, port: int, args: argparse.Namespace, batching: str) -> None:
        from ray import serve

        from handlerkit.serving.ray import app

        super().__init__()
        self.label = "ray serve adapter" if batching == "torchserve" else "ray @serve.batch"
        route = "/" if batching == "torchserve" else "/serve-batch"
        self.handle = serve.run(app(mar, handler=HANDLER if name != "echo" else None, name=name, num_cpus=args.replica_cpus, batching=batching),
                                name=f"{name}-{batching}", route_prefix=route)
        self.url = f"http://127.0.0.1:{port}{route.rstrip('/')}/predictions/{name}"
        # A handle's router may need a running event loop (RAY_SERVE_THROUGHPUT_OPTIMIZED=1).
        self._loop = asyncio.new_event_loop()
        self._before = 0

    def stats(self) -> dict[str, Any]:
        async def ask() -> dict[str, Any]:
            return await self.handle.stats.remote()

        return self._loop.run_until_complete(ask())

    def mark(self) -> None:
        self._before = len(self.stats()["batch_sizes"])

    def handled(self) -> tuple[list[int] | None, list[float]]:
        stats = self.stats()
        self.threads = stats["torch_threads"]
        return stats["batch_sizes"][self._before:], stats["handle_ms"][self._before:]

    def stop(self) -> None:
        """After Serve shut down: the handle's router may live on this loop."""
        self._loop.close()


def ray_pids(exclude: set[int]) -> set[int]:
    """Every process this one started (Ray's GCS, raylet, workers, HAProxy) but TorchServe's."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)} - exclude


def measure(engines: list[Engine], args: argparse.Namespace) -> None:
    """Warm every engine up, then R alternating rounds of each; fills each engine's figures."""
    ts_pids = set().union(*(e.pids() for e in engines))
    groups = {"torchserve": ts_pids, "ray": ray_pids(ts_pids)}  # processes by engine

    def group(engine: Engine) -> str:
        return "torchserve" if isinstance(engine, TorchServeEngine) else "ray"

    for engine in engines:
        load(engine.url, args.warmup, args.clients, engine.body, engine.content_type)
        engine.mark()
    idle = {g: [0.0, 0.0] for g in groups}  # CPU seconds, wall seconds while the other group ran
    for r in range(args.rounds):
        for engine in engines if r % 2 == 0 else engines[::-1]:
            before = {g: _cpu_seconds(pids) for g, pids in groups.items()}
            wall, latencies, statuses = load(engine.url, args.requests_per_round, args.clients, engine.body,
                                             engine.content_type)
            engine.walls.append(wall)
            engine.latencies += latencies
            engine.statuses += statuses
            for g, pids in groups.items():
                used = _cpu_seconds(pids) - before[g]
                if g == group(engine):
                    engine.cpu += used
                else:
                    idle[g][0] += used
                    idle[g][1] += wall
    for engine in engines:
        engine.idle_cpu, engine.idle_wall = idle[group(engine)]


def row(engine: Engine) -> dict[str, Any]:
    sizes, handle_ms = engine.handled()
    ordered = sorted(engine.latencies)
    wall = sum(engine.walls)
    n = len(ordered)
    if sizes is None:
        batches = f"mean {n / len(handle_ms):.2f} ({len(handle_ms)} batches)" if handle_ms else "(no PredictionTime records)"
    else:
        hist = ", ".join(f"{k}:{v}" for k, v in sorted(collections.Counter(sizes).items()))
        batches = f"mean {statistics.mean(sizes):.2f} ({hist}); torch threads {engine.threads}"
    return {
        "req/s": n / wall,
        "round req/s": [n / len(engine.walls) / w for w in engine.walls],
        "p50 ms": statistics.median(ordered),
        "p99 ms": ordered[min(n - 1, int(round(0.99 * (n - 1))))],
        "handle ms": statistics.mean(handle_ms) if handle_ms else float("nan"),
        "busy": sum(handle_ms) / 1000 / wall,
        "cpu": engine.cpu / wall,
        "cpu ms/req": engine.cpu / n * 1000,
        "idle cpu": engine.idle_cpu / engine.idle_wall if engine.idle_wall else float("nan"),
        "statuses": dict(engine.statuses),
        "batches": batches,
    }


def run_model(name: str, mar: Path, tmp: Path, args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    import ray
    from ray import serve

    engines: list[Engine] = []
    port = _free_port()
    try:
        engines.append(TorchServeEngine(mar, name, tmp / f"ts-{name}"))
        # Logical CPUs enough for every replica at once (only one is loaded at a time).
        replicas = 2 if args.serve_batch else 1
        ray.init(address="local", num_cpus=max(2, int(replicas * args.replica_cpus + 0.999)), include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        engines.append(RayEngine(mar, name, port, args, "torchserve"))
        if args.serve_batch:
            engines.append(RayEngine(mar, name, port, args, "serve.batch"))
        measure(engines, args)
        return [(e.label, row(e)) for e in engines]
    finally:
        for engine in engines:
            if isinstance(engine, TorchServeEngine):
                engine.stop()
        if ray.is_initialized():
            try:
                serve.shutdown()
            finally:
                ray.shutdown()
        for engine in engines:
            if isinstance(engine, RayEngine):
                engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests-per-round", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=10)
    parser.add_argument("--models", default="fixture,resnet18")
    parser.add_argument("--replica-cpus", type=float, default=2,
                        help="the replica's num_cpus (Ray sets its OMP_NUM_THREADS to it; TorchServe's worker "
                        "uses torch's default, the core count)")
    parser.add_argument("--ray-high-throughput", action="store_true",
                        help="Ray Serve's high-throughput mode: " + " ".join(f"{k}={v}" for k, v in HIGH_THROUGHPUT_ENV.items()))
    parser.add_argument("--serve-batch", action="store_true",
                        help="also run the adapter with Ray's own @serve.batch (batching='serve.batch')")
    args = parser.parse_args()
    missing = [m for m in ("ray", "psutil", "ts") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"needs ray[serve], psutil and torchserve: pip install 'handlerkit[ray,test]' (missing: {missing})",
              file=sys.stderr)
        return 2
    import _ts_server

    if _ts_server.missing_requirements():
        print(f"cannot start TorchServe: {_ts_server.missing_requirements()}", file=sys.stderr)
        return 2
    if args.ray_high_throughput:
        if not shutil.which("haproxy"):
            print("--ray-high-throughput needs the haproxy binary on PATH (Debian: apt-get install haproxy)",
                  file=sys.stderr)
            return 2
        os.environ.update(HIGH_THROUGHPUT_ENV)  # read by the local Ray instance this process starts

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
        if "echo" in args.models:
            models["echo"] = ROOT / "fixtures" / "models" / "image_classifier"  # its files; ECHO answers
            (tmp / "echo_handler.py").write_text(ECHO)
        for name, model_dir in models.items():
            handler = tmp / "echo_handler.py" if name == "echo" else None
            mar = build_mar(name, model_dir, store, args.batch, args.delay_ms, handler)
            rows += [(name, label, r) for label, r in run_model(name, mar, tmp, args)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    mode = "high-throughput mode (HAProxy)" if args.ray_high_throughput else "default proxy"
    print(f"\n{args.rounds} alternating rounds x {args.requests_per_round} requests per engine, {args.clients} "
          f"closed-loop clients, batchSize {args.batch}, maxBatchDelay {args.delay_ms} ms, 1 worker/replica, "
          f"{os.cpu_count()} CPUs; Ray Serve: {mode}")
    print("handle ms: mean time in handle() per batch; busy: share of the wall time the handler ran;\n"
          "cpu: the engine's processes' CPU (cores) in its rounds, and per request (ms); idle: its CPU\n"
          "(cores) while the other engine ran")
    print(f"{'model':<11} {'engine':<18} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'handle ms':>9} {'busy':>5} "
          f"{'cpu':>5} {'ms/req':>6} {'idle':>5}  statuses  batch sizes")
    for model, engine, r in rows:
        print(f"{model:<11} {engine:<18} {r['req/s']:7.1f} {r['p50 ms']:8.1f} {r['p99 ms']:8.1f} "
              f"{r['handle ms']:9.1f} {r['busy']:5.0%} {r['cpu']:5.2f} {r['cpu ms/req']:6.2f} {r['idle cpu']:5.2f}  "
              f"{r['statuses']}  {r['batches']}")
    missed = False
    by = {(m, e): r for m, e, r in rows}
    for model in models:
        ts, rr = by[(model, "torchserve 0.12")], by[(model, "ray serve adapter")]
        ratio, p99 = rr["req/s"] / ts["req/s"], rr["p99 ms"] / ts["p99 ms"]
        pairs = [a / b for a, b in zip(rr["round req/s"], ts["round req/s"])]
        verdict = ""
        if model == "resnet18":
            ok = ratio >= 0.9 and p99 <= 1.5
            missed |= not ok
            verdict = "  target met" if ok else "  TARGET MISSED (>= 0.9x throughput, <= 1.5x p99)"
        print(f"{model}: adapter/TorchServe throughput {ratio:.2f}x (rounds {min(pairs):.2f}..{max(pairs):.2f}), "
              f"p99 {p99:.2f}x{verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
