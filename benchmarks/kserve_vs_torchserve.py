"""The same model served by handlerkit's KServe adapter and by real TorchServe 0.12 (kservev2), side by side.

Both serve one ``.mar`` built by the real ``torch-model-archiver`` with TorchServe's own
``ts.torch_handler.image_classifier`` (so the engines differ, not the handlers): the adapter as
``kserve.ModelServer`` on loopback (:func:`handlerkit.serving.kserve.start`), TorchServe started
with ``service_envelope=kservev2``, one worker. Every request is the same Open Inference
Protocol v2 ``infer`` body, one ``BYTES`` input holding the base64 of
``fixtures/images/grace_hopper.jpg``, posted to each engine's ``/v2/models/<m>/infer``. One
request is answered by both first and the answers must be equal (kserve's ``"parameters": null``
aside). The method is ``ray_vs_torchserve.py``'s, whose helpers this script uses: closed-loop
client threads, one HTTP connection per request, both engines up at once taking turns over R
alternating rounds, CPU of each engine's processes, pooled throughput ratio with the per-pair
range.

Batching: KServe's Python model server has none (one request is one ``handle``), so TorchServe
gets ``batchSize`` 1 by default, for parity; ``--batch N`` gives TorchServe ``batchSize`` N (and
``--delay-ms``) to show its batching against KServe's none. NB: TorchServe 0.12's ``kservev2``
envelope parses request 0 of a batch only, so a batch of more than one fails whole (503, "number
of batch response mismatched"): the figures then count failures, and the run exits 1.

Where the time goes, per engine: the time ``handle`` took per request (TorchServe: its worker's
``PredictionTime`` records; the adapter's process has no cheap hook that times ``handle`` alone,
kserve's own ``request_predict_seconds`` includes the wait for the handler's thread, so its
handle time is taken to be TorchServe's: the same handler on the same torch), the serving time
per request (wall / requests: at saturation one worker serves one request in that long) and what
of it is not ``handle``, the client's p50 minus ``handle``, and CPU seconds per request.

Target (issue 22): on resnet18, adapter throughput >= 0.9x TorchServe's, p99 <= 1.5x.

Usage: python benchmarks/kserve_vs_torchserve.py [--rounds 5] [--requests-per-round 128]
       [--clients 16] [--batch 1] [--delay-ms 10] [--models fixture,resnet18]
Exit status 1 when the resnet18 target is missed, the engines' answers differ or a request was
not answered 200; 2 when kserve, torchserve (or Java) or psutil is missing.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ray_vs_torchserve import HANDLER, IMAGE, ROOT, Engine, TorchServeEngine, build_mar, measure, row

TARGET = {"model": "resnet18", "throughput": 0.9, "p99": 1.5}
ADAPTER, TORCHSERVE = "kserve adapter", "torchserve 0.12"


def v2_body(image: Path = IMAGE, request_id: str = "bench") -> bytes:
    """The v2 ``infer`` body every request posts: the image's base64 as one ``BYTES`` element."""
    data = base64.b64encode(image.read_bytes()).decode("ascii")
    inputs = [{"name": "img", "shape": [1], "datatype": "BYTES", "data": [data]}]
    return json.dumps({"id": request_id, "inputs": inputs}).encode()


class TorchServeV2Engine(TorchServeEngine):
    """Real TorchServe 0.12 with ``service_envelope=kservev2``, answering its own KServe v2 route."""

    label = TORCHSERVE
    content_type = "application/json"

    def __init__(self, mar: Path, name: str, root: Path) -> None:
        import _ts_server

        Engine.__init__(self)
        self.ts = _ts_server.TorchServe(root=root, models={name: mar.name}, model_store=mar.parent,
                                        properties={"service_envelope": "kservev2"})
        self.ts.start(timeout=180)
        self.url = f"http://127.0.0.1:{self.ts.inference_port}/v2/models/{name}/infer"
        self._before = 0


class KServeEngine(Engine):
    """handlerkit's KServe adapter: ``kserve.ModelServer`` in a child process on 127.0.0.1.

    Its process is counted by ``measure`` as every child of this process but TorchServe's."""

    label = ADAPTER
    content_type = "application/json"

    def __init__(self, mar: Path, name: str, log: Path) -> None:
        from handlerkit.serving.kserve import start

        super().__init__()
        self.server = start(mar, handler=HANDLER, name=name, log=log, timeout=180)
        self.url = f"{self.server.v2_url}/infer"

    def handled(self) -> tuple[list[int] | None, list[float]]:
        return None, []  # not timed in its process: see the module docstring

    def stop(self) -> None:
        self.server.stop()


def answer(url: str, body: bytes) -> tuple[int, Any]:
    """One v2 request: its status and its document, without the ``"parameters": null`` that
    kserve's response model adds (TorchServe's has none)."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, _without_null_parameters(json.loads(raw))


def _without_null_parameters(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _without_null_parameters(v) for k, v in doc.items() if not (k == "parameters" and v is None)}
    if isinstance(doc, list):
        return [_without_null_parameters(v) for v in doc]
    return doc


def same_answers(model: str, ours: tuple[int, Any], theirs: tuple[int, Any]) -> bool:
    """Print whether the adapter answered as TorchServe did; True when equal (and 200)."""
    if ours == theirs and ours[0] == 200:
        print(f"{model}: answers equal (status 200, {len(json.dumps(ours[1]))} bytes of JSON)")
        return True
    print(f"{model}: ANSWERS DIFFER: adapter {ours[0]} {json.dumps(ours[1])[:300]}\n"
          f"{'':>{len(model) + 16}}torchserve {theirs[0]} {json.dumps(theirs[1])[:300]}")
    return False


def where_the_time_goes(ours: dict[str, Any], ts: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per engine, ms per request: ``handle`` (TorchServe's records; the adapter's taken to be
    the same), serving time (wall / requests), its part outside ``handle``, p50 minus ``handle``,
    and CPU."""
    handle = ts["busy"] * 1000 / ts["req/s"]  # all PredictionTime / all requests: per request, batched or not
    out = {}
    for label, r in ((ADAPTER, ours), (TORCHSERVE, ts)):
        served = 1000 / r["req/s"]
        out[label] = {"handle": handle, "served": served, "outside": served - handle,
                      "p50 outside": r["p50 ms"] - handle, "cpu": r["cpu ms/req"]}
    return out


def verdict(model: str, ours: dict[str, Any], ts: dict[str, Any]) -> tuple[str, bool]:
    """The comparison line for one model, and whether it missed the target (resnet18 only)."""
    ratio, p99 = ours["req/s"] / ts["req/s"], ours["p99 ms"] / ts["p99 ms"]
    pairs = [a / b for a, b in zip(ours["round req/s"], ts["round req/s"])]
    line = (f"{model}: adapter/TorchServe throughput {ratio:.2f}x (rounds {min(pairs):.2f}..{max(pairs):.2f}), "
            f"p99 {p99:.2f}x")
    if model != TARGET["model"]:
        return line, False
    ok = ratio >= TARGET["throughput"] and p99 <= TARGET["p99"]
    return line + ("  target met" if ok else "  TARGET MISSED (>= 0.9x throughput, <= 1.5x p99)"), not ok


def run_model(name: str, mar: Path, tmp: Path, args: argparse.Namespace) -> tuple[bool, list[tuple[str, dict]]]:
    """Both engines up at once: the answer check, then the alternating rounds."""
    engines: list[Engine] = []
    try:
        engines.append(TorchServeV2Engine(mar, name, tmp / f"ts-{name}"))
        engines.append(KServeEngine(mar, name, tmp / f"kserve-{name}.log"))
        body = v2_body()
        for engine in engines:
            engine.body = body
        ts, ours = engines
        equal = same_answers(name, answer(ours.url, body), answer(ts.url, body))
        measure(engines, args)
        rows = []
        for engine in engines:
            r = row(engine)
            if isinstance(engine, KServeEngine):
                r["batches"] = "1 per request (KServe's Python server has no batching)"
            rows.append((engine.label, r))
        return equal, rows
    finally:
        for engine in engines:
            engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests-per-round", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1,
                        help="TorchServe's batchSize (default 1: KServe's Python server does not batch; "
                        "TorchServe 0.12's kservev2 envelope fails batches of more than one with 503)")
    parser.add_argument("--delay-ms", type=int, default=10, help="TorchServe's maxBatchDelay")
    parser.add_argument("--models", default="fixture,resnet18")
    args = parser.parse_args()
    missing = [m for m in ("kserve", "psutil", "ts") if importlib.util.find_spec(m) is None]
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
            same, model_rows = run_model(name, mar, tmp, args)
            equal &= same
            rows += [(name, label, r) for label, r in model_rows]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(rows, args, equal)


def report(rows: list[tuple[str, str, dict[str, Any]]], args: argparse.Namespace, equal: bool = True) -> int:
    """The figures, where the time goes, and the verdict: 1 when the target is missed or the
    answers differed."""
    batching = ("batchSize 1 (parity: KServe does not batch)" if args.batch == 1 else
                f"TorchServe batchSize {args.batch}, maxBatchDelay {args.delay_ms} ms; KServe: none")
    print(f"\n{args.rounds} alternating rounds x {args.requests_per_round} requests per engine, {args.clients} "
          f"closed-loop clients, v2 infer (BYTES base64 JPEG), {batching}, 1 worker, {os.cpu_count()} CPUs")
    print("cpu: the engine's processes' CPU (cores) in its rounds; idle: its CPU (cores) while the other ran")
    print(f"{'model':<11} {'engine':<16} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'cpu':>5} {'idle':>5}  statuses  "
          "batch sizes")
    for model, engine, r in rows:
        print(f"{model:<11} {engine:<16} {r['req/s']:7.1f} {r['p50 ms']:8.1f} {r['p99 ms']:8.1f} {r['cpu']:5.2f} "
              f"{r['idle cpu']:5.2f}  {r['statuses']}  {r['batches']}")
    by = {(m, e): r for m, e, r in rows}
    print("\nwhere the time goes, ms per request: handle (TorchServe's PredictionTime; the adapter's taken as\n"
          "the same handler's), served (wall / requests), outside handle (served - handle), p50 - handle, CPU")
    missed = not equal
    for model in dict.fromkeys(m for m, _, _ in rows):
        ours, ts = by[(model, ADAPTER)], by[(model, TORCHSERVE)]
        for label, t in where_the_time_goes(ours, ts).items():
            print(f"  {model:<11} {label:<16} handle {t['handle']:7.2f}  served {t['served']:7.2f}  "
                  f"outside {t['outside']:7.2f}  p50-handle {t['p50 outside']:8.2f}  cpu {t['cpu']:7.2f}")
    if any(t["outside"] < 0 for m in dict.fromkeys(m for m, _, _ in rows)
           for t in where_the_time_goes(by[(m, ADAPTER)], by[(m, TORCHSERVE)]).values()):
        print("  (negative: the adapter served a request in less than TorchServe's handle took, so its own\n"
              "  handle was faster than TorchServe's and the estimate does not hold for it)")
    for model in dict.fromkeys(m for m, _, _ in rows):
        line, miss = verdict(model, by[(model, ADAPTER)], by[(model, TORCHSERVE)])
        print(line)
        missed |= miss
    if not equal:
        print("the engines' answers differed (above): the figures compare different work")
    failed = sorted({f"{model} {engine}" for model, engine, r in rows if set(r["statuses"]) != {200}})
    if failed:
        print(f"NOT ALL ANSWERED 200: {', '.join(failed)} (statuses above): the figures compare failures")
        missed = True
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
