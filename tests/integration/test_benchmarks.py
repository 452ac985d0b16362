"""The benchmark scripts run (their targets are judged by running them, not here: timings
on a shared machine are too noisy for a test)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import harness_overhead  # noqa: E402

from handlerkit.cli import demo_paths  # noqa: E402


def test_overhead_measure_times_every_variant_in_every_round():
    model_dir, images = demo_paths()
    bare_ms, extras = harness_overhead.measure(model_dir, images[0], rounds=3, warmup=1, block=2)
    assert bare_ms > 0
    assert set(extras) == {label for label, _, _ in harness_overhead.VARIANTS}
    assert all(len(samples) == 3 for samples in extras.values())


def test_builtin_benchmark_judges_answers_against_torchserve(tmp_path, capsys):
    """The benchmark's exactness check on two of its photo-like JPEGs: handlerkit's answers are
    TorchServe's own ImageClassifier's, bit for bit, on resnet18; the fast_resize opt-in's are not."""
    import builtin_vs_torchserve as bench
    from ts.torch_handler.image_classifier import ImageClassifier as TorchServeImageClassifier

    import handlerkit as hk

    model_dir = bench.resnet18_model_dir(str(tmp_path))
    batch = hk.batch(*(hk.Request.from_bytes(image, "image/jpeg") for image in bench.photo_jpegs(n=2)))
    ts = bench.Contender("TorchServe 0.12", TorchServeImageClassifier(), model_dir)
    ours = bench.Contender("handlerkit", hk.handlers.ImageClassifier(), model_dir)
    fast = bench.Contender("fast", hk.handlers.ImageClassifier(), model_dir, {"handler": {"fast_resize": True}})
    assert bench.check_answers("two photos", ts, [ours], batch)
    out = capsys.readouterr().out
    assert "top-1 same on 2/2" in out and out.rstrip().endswith(" identical")
    assert not bench.check_answers("two photos", ts, [fast], batch)  # the check can fail
    assert "MISSED: not identical" in capsys.readouterr().out
    same, total, worst, _ = bench.agreement([{"a": 0.6, "b": 0.4}], [{"b": 0.55, "a": 0.45}])
    assert (same, total) == (0, 1) and abs(worst - 0.05) < 1e-9  # the check can fail


def test_streaming_benchmark_judges_ttfc_and_chunk_rate(capsys):
    """The streaming benchmark's verdict: the adapter's p50 time to first chunk within 1.1x of
    TorchServe's and its chunks/s at least 0.9x; a wrong reply fails it whatever the speed."""
    import argparse

    import streaming_vs_torchserve as bench

    def engine(label, ttfc_ms, wall, wrong=0):
        e = bench.Engine(label, 0, "/", set(), walls=[wall], cpu=0.5, wrong=wrong)
        e.results = [bench.Streamed(ttfc_ms, 100.0, 11, "x", 200) for _ in range(10)]
        return e

    args = argparse.Namespace(batch=4, delay_ms=10, clients=8, rounds=1, requests_per_round=10)
    assert bench.report([engine("ts", 50.0, 1.0), engine("ray", 54.0, 1.05)], args) == 0
    assert "time to first chunk p50 1.08x" in capsys.readouterr().out
    assert bench.report([engine("ts", 50.0, 1.0), engine("ray", 60.0, 1.0)], args) == 1  # 1.2x: too slow to start
    assert bench.report([engine("ts", 50.0, 1.0), engine("ray", 50.0, 1.2)], args) == 1  # 0.83x the chunk rate
    assert bench.report([engine("ts", 50.0, 1.0), engine("ray", 50.0, 1.0, wrong=1)], args) == 1
    assert "1 replies were not the corpus line's rest" in capsys.readouterr().out
    cases = bench.expected()
    assert cases[0] == ("a handler ", "turns each request into an answer." * 2)  # streamed rest, then the final answer


def test_format_lab_benchmark_does_the_labs_work_plainly(tmp_path):
    """The plain side of benchmarks/format_lab.py runs what the lab runs (here: eager and
    TorchScript on the fixture classifier) and leaves the handler's own model in place."""
    import format_lab

    import handlerkit as hk

    h = hk.Harness.open(os.path.join(ROOT, "fixtures", "models", "image_classifier"))
    h.initialize()
    model = h.handler.model
    batch = hk.batch(hk.Request.from_file(os.path.join(ROOT, "fixtures", "images", "circle.png")))
    format_lab.plain(h, batch, ["eager", "torchscript"], repeat=2, warmup=1, workdir=str(tmp_path))
    assert h.handler.model is model and any(p.name.startswith("torchscript") for p in tmp_path.iterdir())


def test_cold_start_benchmark_judges_the_ratios_and_the_hits(capsys):
    """benchmarks/compile_cold_start.py's verdict: shipped >= 8x faster than cold and within 1.5x
    of warm with every cache lookup a hit; AOTInductor within 2x of eager. Each can fail alone."""
    import compile_cold_start as bench

    def row(first_s, hits=0, misses=0, built=0):
        counters = {"inductor.fxgraph_cache_hit": hits, "inductor.fxgraph_cache_miss": misses}
        return {"first_answer_s": first_s, "init_s": 0.1, "imports_s": 2.0, "built": built, "counters": counters,
                "cache": {"kernels": {"reason": "restored 9 kernel files"}}}

    def results(cold=16.0, warm=1.2, shipped=1.4, aoti=0.8, eager=0.5, misses=0):
        return {"cold": [row(cold, misses=1, built=9)], "warm": [row(warm, hits=1)],
                "shipped": [row(shipped, hits=2, misses=misses)], "aoti": [row(aoti)], "eager": [row(eager)]}

    assert bench.report("m", results(), 4)
    out = capsys.readouterr().out
    assert "(a) cold / (c) shipped    11.43x  target >= 8\n" in out and "(c) cache hits           2/2  target 100 %\n" in out
    assert "restored 9 kernel files" in out
    assert not bench.report("m", results(cold=10.0), 4)  # 7.1x: not 8x faster than cold
    assert "7.14x  target >= 8  MISSED" in capsys.readouterr().out
    assert not bench.report("m", results(shipped=1.9), 4)  # 1.58x the warm start
    assert not bench.report("m", results(aoti=1.1), 4)  # 2.2x eager
    assert not bench.report("m", results(misses=1), 4)  # a miss: 2/3 hits
    assert "2/3  target 100 %  MISSED" in capsys.readouterr().out


def _stub_server(reply: bytes):
    """A loopback HTTP server answering every POST with ``reply``; it records what came."""
    import http.server
    import threading

    seen: list[tuple[str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.headers["Content-Type"], self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_kserve_benchmark_posts_kserve_bodies_and_compares_predictions(capsys):
    """The adapter's requests (benchmarks/kserve_vs_torchserve.py) carry the JPEG as a v1 instance
    or a v2 BYTES input; the prediction is read out of either document and must equal
    TorchServe's own answer (within 1e-4) to pass."""
    import base64
    import json

    import kserve_vs_torchserve as bench
    import ray_vs_torchserve

    top = {"a": 0.75, "b": 0.25}
    v1 = bench.kserve_body("v1")
    [instance] = json.loads(v1)["instances"]
    assert base64.b64decode(instance["data"]) == bench.IMAGE.read_bytes()
    [inp] = json.loads(bench.kserve_body("v2"))["inputs"]
    assert (inp["name"], inp["shape"], inp["datatype"]) == ("img", [1], "BYTES")
    server, seen = _stub_server(json.dumps({"predictions": [top]}).encode())
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/models/m:predict"
        wall, latencies, statuses = ray_vs_torchserve.load(url, 5, 2, v1, "application/json")
        assert statuses == {200: 5} and len(latencies) == 5 and wall > 0
        assert seen == [("application/json", v1)] * 5
        ours = bench.predictions(url, v1, "application/json", "v1")
    finally:
        server.shutdown()
        server.server_close()
    assert ours == (200, top)
    assert bench.same_answers("m", ours, (200, {"a": 0.75, "b": 0.25 + 1e-6}))
    assert "m: predictions equal (status 200, top 2)" in capsys.readouterr().out
    assert not bench.same_answers("m", ours, (200, {"a": 0.5, "b": 0.5}))  # the check can fail
    assert "m: ANSWERS DIFFER: adapter 200" in capsys.readouterr().out
    assert not bench.same_answers("m", (503, b"x"), (503, b"x"))  # equal failures are no pass


def test_kserve_benchmark_judges_resnet18_against_torchserve_and_shows_ray(capsys):
    """The verdict: on resnet18 the adapter needs >= 1.0x TorchServe's throughput and <= 1.5x its
    p99 (exit 1 otherwise, or when the answers differed or a request failed); Ray's figure is shown."""
    import argparse

    import kserve_vs_torchserve as bench

    def r(rps, p99):
        return {"req/s": rps, "round req/s": [rps * 0.95, rps * 1.05], "p50 ms": p99 / 2, "p99 ms": p99,
                "cpu": 1.0, "idle cpu": 0.0, "statuses": {200: 10}, "batches": "mean 8.00"}  # fmt: skip

    args = argparse.Namespace(rounds=2, requests_per_round=10, clients=16, batch=8, delay_ms=10, protocol="v1")
    ts = r(20.0, 100.0)
    rows = [("resnet18", bench.TORCHSERVE, ts), ("resnet18", bench.ADAPTER, r(21.0, 140.0))]
    assert bench.report(rows, args) == 0
    out = capsys.readouterr().out
    assert "resnet18: adapter/TorchServe throughput 1.05x (rounds 1.05..1.05), p99 1.40x  target met" in out
    assert "batchSize 8, maxBatchDelay 10 ms" in out and "adapter: v1 :predict" in out
    assert bench.report(rows, args, equal=False) == 1
    assert "answers differed" in capsys.readouterr().out
    assert bench.report([rows[0], ("resnet18", bench.ADAPTER, r(19.0, 100.0))], args) == 1  # 0.95x throughput
    assert bench.report([rows[0], ("resnet18", bench.ADAPTER, r(20.0, 160.0))], args) == 1  # 1.6x p99
    assert "TARGET MISSED (>= 1.0x throughput, <= 1.5x p99)" in capsys.readouterr().out
    failing = {**r(21.0, 140.0), "statuses": {200: 2, 503: 8}}
    assert bench.report([rows[0], ("resnet18", bench.ADAPTER, failing)], args) == 1
    assert "NOT ALL ANSWERED 200: resnet18 kserve adapter (statuses above)" in capsys.readouterr().out
    with_ray = [*rows, ("resnet18", bench.RAY, r(18.0, 150.0))]
    assert bench.report(with_ray, args) == 0  # Ray's figure is shown, not judged
    out = capsys.readouterr().out
    assert "resnet18: ray adapter/TorchServe throughput 0.90x (rounds 0.90..0.90), p99 1.50x  (the Ray figure, for reference)\n" in out
    assert "resnet18: kserve adapter/ray adapter throughput 1.17x, p99 0.93x" in out
    small = [("classifier", bench.TORCHSERVE, r(100.0, 10.0)), ("classifier", bench.ADAPTER, r(50.0, 30.0))]
    assert bench.report(small, args) == 0  # no target but resnet18's


def test_attribution_benchmark_times_each_variant_and_checks_the_request_named(tmp_path):
    """The benchmark's failing batches name their request (0, then the last), or it raises."""
    import attribution
    from _new_users import ranker_dir

    model_dir = str(ranker_dir(tmp_path / "recs", base="handlerkit"))
    samples = attribution.measure(model_dir, size=4, rounds=2)
    assert set(samples) == set(attribution.VARIANTS) and all(len(v) == 2 for v in samples.values())
