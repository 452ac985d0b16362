"""A streaming generator served by handlerkit's Ray Serve adapter and by real TorchServe 0.12, side by side.

Both serve one ``.mar`` built by the real ``torch-model-archiver`` from the fixture
``fixtures/models/text_generator`` (a character-level GRU whose handler, written on TorchServe's
own ``BaseHandler``, sends every generated character with ``send_intermediate_predict_response``):
one worker / one replica, the same ``batchSize`` and ``maxBatchDelay``. The load is closed loop:
C client threads each stream their share of the round's requests (one HTTP connection per
request, loopback), each prompt the first two words of a line of the fixture's corpus, so every
reply is that line's rest, one HTTP chunk per character and the final answer as the last chunk.

The client reads the chunked body as it arrives and times, per request: the first chunk (time to
first chunk, from the request's send), every chunk, and the end. Both engines are up at once and
take turns, R rounds each, alternating, so the drift of a shared machine hits both alike.

Reported per engine over all its rounds: time to first chunk p50/p99, chunks per second (all
chunks / all wall time), requests per second, the CPU its processes used per chunk, and every
reply checked against the corpus. Targets (issue 20): the adapter's time to first chunk p50
<= 1.1x TorchServe's, and its chunks per second >= 0.9x.

Ray runs as installed unless ``--ray-throughput-optimized``, which starts the local Ray instance
with Ray Serve's ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (user code on the replica's event loop,
the router in the caller's loop, request logs buffered, direct ingress to the replica): the
setting Ray Serve documents for throughput, still on loopback (its HAProxy mode is not used: it
binds every interface).

Usage: python benchmarks/streaming_vs_torchserve.py [--rounds 4] [--requests-per-round 32]
       [--clients 8] [--batch 4] [--delay-ms 10] [--ray-throughput-optimized]
Exit status 1 when a target is missed or a reply is wrong; 2 when ray or torchserve is missing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
MODEL_DIR = ROOT / "fixtures" / "models" / "text_generator"
NAME = "text_generator"
TARGETS = {"ttfc": 1.1, "chunks/s": 0.9}

from ray_vs_torchserve import _cpu_seconds, _free_port  # noqa: E402  (one way to count an engine's CPU)


@dataclass
class Streamed:
    """One streamed request, as the client saw it."""

    ttfc_ms: float
    total_ms: float
    chunks: int  # reads that returned data; set to the HTTP chunks of the reply once it is checked
    body: str
    status: int


def stream(host: str, port: int, path: str, prompt: str) -> Streamed:
    """POST ``prompt`` and read the chunked answer as it comes: the time of its first chunk,
    its chunks (each ``read1`` that returns data is what arrived together), its whole text."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=120)
    try:
        connection.request("POST", path, body=prompt.encode(), headers={"Content-Type": "text/plain"})
        response = connection.getresponse()
        first, parts = None, []
        while True:
            data = response.read1(65536)
            if not data:
                break
            if first is None:
                first = time.perf_counter()
            parts.append(data)
        end = time.perf_counter()
    finally:
        connection.close()
    first = first or end
    return Streamed((first - start) * 1000, (end - start) * 1000, len(parts), b"".join(parts).decode(), response.status)


def expected() -> list[tuple[str, str]]:
    """(prompt, the whole streamed text) for every line of the fixture's corpus."""
    from fixtures.builder.generator import LINES, prompt_of

    return [(prompt_of(line), line[len(prompt_of(line)) :] * 2) for line in LINES]


@dataclass
class Engine:
    label: str
    port: int
    path: str
    pids: set[int]
    results: list[Streamed] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    cpu: float = 0.0
    wrong: int = 0


def load(engine: Engine, requests: int, clients: int, cases: list[tuple[str, str]]) -> None:
    """One closed-loop round; results and wall time appended to ``engine``."""

    def client(k: int) -> list[tuple[Streamed, str]]:
        out = []
        for i in range(k, requests, clients):
            prompt, text = cases[i % len(cases)]
            out.append((stream("127.0.0.1", engine.port, engine.path, prompt), text))
        return out

    before = _cpu_seconds(engine.pids)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        done = [r for part in pool.map(client, range(clients)) for r in part]
    engine.walls.append(time.perf_counter() - start)
    engine.cpu += _cpu_seconds(engine.pids) - before
    for result, text in done:
        result.chunks = len(text) // 2 + 1  # a chunk per character, then the final answer (reads may merge them)
        engine.results.append(result)
        # The reply streams the rest of the line, then repeats it whole as the final answer.
        engine.wrong += result.status != 200 or result.body != text


def figures(engine: Engine) -> dict[str, float]:
    ttfc = sorted(r.ttfc_ms for r in engine.results)
    chunks = sum(r.chunks for r in engine.results)
    wall = sum(engine.walls)
    return {
        "ttfc p50 ms": statistics.median(ttfc),
        "ttfc p99 ms": ttfc[min(len(ttfc) - 1, round(0.99 * (len(ttfc) - 1)))],
        "chunks/s": chunks / wall,
        "req/s": len(engine.results) / wall,
        "cpu ms/chunk": engine.cpu / chunks * 1000,
        "chunks/req": chunks / len(engine.results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests-per-round", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--delay-ms", type=int, default=10)
    parser.add_argument("--ray-throughput-optimized", action="store_true",
                        help="start Ray with RAY_SERVE_THROUGHPUT_OPTIMIZED=1")
    args = parser.parse_args()
    if args.ray_throughput_optimized:
        os.environ.update(RAY_SERVE_THROUGHPUT_OPTIMIZED="1", RAY_SERVE_DEFAULT_HTTP_HOST="127.0.0.1")  # read by Ray at start
    for package in ("ray", "ts", "psutil"):
        if importlib.util.find_spec(package) is None:
            print(f"needs {package}: pip install 'handlerkit[test,ray]'")
            return 2
    import psutil
    import ray
    from ray import serve

    import _ts_server
    from handlerkit.serving.ray import app

    cases = expected()
    engines: list[Engine] = []
    with tempfile.TemporaryDirectory(prefix="handlerkit-streaming-bench-") as tmp:
        store = Path(tmp) / "store"
        config = Path(tmp) / "config.yaml"
        config.write_text(
            f"minWorkers: 1\nmaxWorkers: 1\nbatchSize: {args.batch}\nmaxBatchDelay: {args.delay_ms}\n"
            "responseTimeout: 120\nhandler:\n  max_new_chars: 64\n"
        )
        mar = _ts_server.archive(
            name=NAME, version="1.0", model_file=MODEL_DIR / "model.py", serialized_file=MODEL_DIR / "model.pt",
            handler=MODEL_DIR / "handler.py", extra_files=[MODEL_DIR / "chars.json"], config_file=config,
            export_path=store,
        )
        ts = _ts_server.TorchServe(root=Path(tmp) / "ts", models={NAME: mar.name}, model_store=store)
        ts.start(timeout=180)
        try:
            root = psutil.Process(ts.process.pid)
            ts_pids = {root.pid, *(p.pid for p in root.children(recursive=True))}
            engines.append(Engine("torchserve 0.12", ts.inference_port, f"/predictions/{NAME}", ts_pids))
            port = _free_port()
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(app(mar, name=NAME, num_cpus=2), name=NAME, route_prefix="/")
            ray_pids = {p.pid for p in psutil.Process().children(recursive=True)} - ts_pids
            engines.append(Engine("ray serve adapter", port, f"/predictions/{NAME}", ray_pids))
            for engine in engines:  # warm-up, not counted
                load(engine, args.warmup, args.clients, cases)
                engine.results, engine.walls, engine.cpu, engine.wrong = [], [], 0.0, 0
            for r in range(args.rounds):
                for engine in engines if r % 2 == 0 else engines[::-1]:
                    load(engine, args.requests_per_round, args.clients, cases)
        finally:
            ts.stop()
            if ray.is_initialized():
                try:
                    serve.shutdown()
                finally:
                    ray.shutdown()
    return report(engines, args)


def report(engines: list[Engine], args: argparse.Namespace) -> int:
    ts, ours = (figures(e) for e in engines)
    print(f"streaming generator, batch {args.batch}, delay {args.delay_ms} ms, {args.clients} clients, "
          f"{args.rounds} rounds of {args.requests_per_round} requests per engine\n")
    keys = list(ts)
    print(f"{'engine':20}" + "".join(f"{k:>15}" for k in keys) + f"{'wrong':>8}")
    for engine, row in zip(engines, (ts, ours), strict=True):
        print(f"{engine.label:20}" + "".join(f"{row[k]:15.2f}" for k in keys) + f"{engine.wrong:8d}")
    ttfc_ratio = ours["ttfc p50 ms"] / ts["ttfc p50 ms"]
    rate_ratio = ours["chunks/s"] / ts["chunks/s"]
    ok_ttfc, ok_rate = ttfc_ratio <= TARGETS["ttfc"], rate_ratio >= TARGETS["chunks/s"]
    print(f"\nadapter / torchserve: time to first chunk p50 {ttfc_ratio:.2f}x (target <= {TARGETS['ttfc']}x)"
          f"{'' if ok_ttfc else '  MISSED'}; chunks/s {rate_ratio:.2f}x (target >= {TARGETS['chunks/s']}x)"
          f"{'' if ok_rate else '  MISSED'}; p99 {ours['ttfc p99 ms'] / ts['ttfc p99 ms']:.2f}x; "
          f"CPU per chunk {ours['cpu ms/chunk'] / ts['cpu ms/chunk']:.2f}x")
    wrong = sum(e.wrong for e in engines)
    if wrong:
        print(f"{wrong} replies were not the corpus line's rest")
    return 0 if ok_ttfc and ok_rate and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
