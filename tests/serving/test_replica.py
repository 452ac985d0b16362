"""handlerkit.serving._replica on a real local Ray instance (loopback only, 2 CPUs): one replica is one TorchServe worker.

One Ray instance for the module: the fixture classifier under handlerkit's handler and under
TorchServe's own ``ts.torch_handler.image_classifier``, each answer compared with the harness.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray  # the `ray` extra is in the test extra: CI has it, and a missing ray fails
from ray import serve

import handlerkit as hk
from handlerkit.serving._replica import SWITCH_INTERVAL_S
from handlerkit.serving.ray import app

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = sorted(p for p in (ROOT / "fixtures" / "images").iterdir() if p.suffix in (".png", ".jpg"))
TRUNCATED = ROOT / "fixtures" / "bad" / "truncated.png"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, port: int, handles: dict[str, Any]) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.handles = handles

    def post(self, path: str, path_or_bytes: Path | bytes, content_type: str | None = None) -> tuple[int, dict, bytes]:
        data = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
        headers = {"Content-Type": content_type} if content_type else {}
        request = urllib.request.Request(self.base + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


DESCRIBING = """
from handlerkit.handlers.image_classifier import ImageClassifier


class Describing(ImageClassifier):
    def describe_handle(self):
        return {"kind": "shapes", "classes": 5}
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    described = tmp_path_factory.mktemp("described") / "image_classifier"
    shutil.copytree(MODEL, described)
    (described / "describing.py").write_text(DESCRIBING)
    # "local": never join a cluster some `ray start` left behind (ray.init's default would)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the port is picked after Ray's own processes have bound theirs, so none of them takes it
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        handles = {
            "hk": serve.run(app(MODEL), name="hk", route_prefix="/"),
            "ts": serve.run(app(MODEL, handler="ts.torch_handler.image_classifier", name="ts_classifier",
                                num_replicas=1), name="ts", route_prefix="/ts"),
            # Ray's own @serve.batch, a handler file in the model dir, no CPU reserved (2 are taken).
            "sb": serve.run(app(described, handler="describing.py", name="described", batching="serve.batch",
                                num_cpus=0), name="sb", route_prefix="/sb"),
        }
        yield Served(port, handles)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


DOUBLING = """
def handle(data, context):
    if data is None:  # TorchServe's load call
        return None
    return [x * 2 for x in data]
"""


def test_the_json_envelope_answers_as_the_harness_does(served: Served, tmp_path: Path) -> None:
    model = tmp_path / "doubling"
    model.mkdir()
    (model / "handler.py").write_text(DOUBLING)
    (model / "MAR-INF").mkdir()
    (model / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(
        {"runtime": "python", "model": {"modelName": "doubling", "handler": "handler.py", "modelVersion": "1.0"}}))
    serve.run(app(model, envelope="json", num_cpus=0), name="envelope", route_prefix="/envelope")
    harness = hk.Harness.open(model, envelope="json")
    documents = [{"instances": [1, 2, 3]}, {"instances": [10]}, {"instances": [0.5, -1]}]

    def send(document: dict) -> tuple[int, dict, bytes]:
        return served.post("/envelope/predictions/doubling", json.dumps(document).encode(), "application/json")

    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # batched or not, each answer is its own
        answers = list(pool.map(send, documents))
    for document, (status, _, body) in zip(documents, answers):
        expected = harness.run(hk.batch(hk.Request.json(document))).output[0]
        assert (status, body.decode()) == (200, expected)
        assert json.loads(body) == {"predictions": [x * 2 for x in document["instances"]]}
    # A body the envelope cannot read is the client's error (400), as the harness reports it.
    status, _, body = served.post("/envelope/predictions/doubling", b'{"rows": [1]}', "application/json")
    assert status == 400 and "needs a non-empty list under 'instances'" in json.loads(body)["message"], body
    serve.delete("envelope")


def _expected(handler: str, path: Path) -> Any:
    ctx = hk.MockContext.from_model_dir(MODEL)
    run = hk.Harness(handler, ctx).run(hk.batch(hk.Request.from_file(path)))
    return run.output[0]


def _assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)  # same labels, same order
    assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-4)


def test_cli_serve_prints_the_url_answers_and_stops_quietly_on_sigterm(tmp_path: Path) -> None:
    # First in the module: its own local Ray instance, before the module's one starts.
    import subprocess
    import sys

    port = _free_port()
    cmd = [sys.executable, "-m", "handlerkit.cli", "serve", str(MODEL), "--engine", "ray",
           "--port", str(port), "--num-cpus", "2", "--for", "60"]
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            line = proc.stdout.readline()  # the URL line, printed once serving (or EOF on failure)
            url = f"http://127.0.0.1:{port}/predictions/image_classifier"
            assert url in line, line
            status, headers, body = Served(port, {}).post("/predictions/image_classifier", IMAGES[0], "image/png")
            assert status == 200, body
            _assert_same(json.loads(body), _expected("image_classifier", IMAGES[0]))
        finally:
            proc.terminate()  # SIGTERM: a clean stop, as Ctrl-C
            try:
                rest, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                raise
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 0 and stderr.rstrip().endswith("handlerkit: interrupted"), stderr
    # serve.shutdown() makes Ray print "Task ServeController.graceful_shutdown failed ... killed by ray.kill".
    for noise in ("graceful_shutdown", "killed by `ray.kill`", "Traceback"):
        assert noise not in stderr and noise not in rest, (noise, stderr, rest)


def test_cli_serve_address_deploys_to_an_existing_cluster_and_removes_only_its_app() -> None:
    # A real Ray head started by `ray start` (its own temp dir, loopback HTTP), before the
    # module's local instance starts.
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    gcs, http = _free_port(), _free_port()
    temp_dir = tempfile.mkdtemp(prefix="hkray-", dir="/tmp")  # short: it holds unix sockets
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # the head's token auth (Ray's default)
    head = subprocess.Popen(
        # `ray start`, through its module: a venv need not have the `ray` script beside its python
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={gcs}",
         "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp_dir}", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    cli = None
    try:
        deadline = time.monotonic() + 60
        while True:  # the head's GCS accepts connections
            try:
                socket.create_connection(("127.0.0.1", gcs), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and head.poll() is None, "ray start --head did not come up"
                time.sleep(0.3)
        cmd = [sys.executable, "-m", "handlerkit.cli", "serve", str(MODEL), "--address", f"127.0.0.1:{gcs}",
               "--port", str(http), "--for", "30"]
        cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line = cli.stdout.readline()
        assert f"http://127.0.0.1:{http}/predictions/image_classifier" in line, line
        served = Served(http, {})
        status, _, body = served.post("/predictions/image_classifier", IMAGES[0], "image/png")
        assert status == 200, body
        _assert_same(json.loads(body), _expected("image_classifier", IMAGES[0]))
        with urllib.request.urlopen(served.base + "/-/routes", timeout=30) as resp:
            assert json.loads(resp.read()) == {"/": "image_classifier"}  # an app named after the model
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 0
        # Only its application is gone: the cluster and its Serve proxy still answer.
        assert head.poll() is None
        with urllib.request.urlopen(served.base + "/-/routes", timeout=30) as resp:
            assert json.loads(resp.read()) == {}
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
        try:
            os.killpg(head.pid, signal.SIGTERM)  # the head, its raylet, GCS and workers
            head.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_64_concurrent_requests_batched_and_equal_to_the_harness(served: Served) -> None:
    expected = {p: _expected("image_classifier", p) for p in IMAGES}
    jobs = [IMAGES[i % len(IMAGES)] for i in range(64)]

    def client(k: int) -> list[tuple[Path, int, bytes]]:
        return [(p, *served.post("/predictions/image_classifier", p, "image/png" if p.suffix == ".png" else "image/jpeg")[::2])
                for p in jobs[k::8]]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [a for chunk in pool.map(client, range(8)) for a in chunk]
    assert len(answers) == 64
    for path, status, body in answers:
        assert status == 200, body
        _assert_same(json.loads(body), expected[path])
    stats = served.handles["hk"].stats.remote().result()
    sizes = stats["batch_sizes"]
    assert stats["switch_interval"] == pytest.approx(SWITCH_INTERVAL_S)  # handle() waits less for the GIL
    assert sum(sizes) >= 64
    assert max(sizes) > 1, sizes  # really batched
    assert max(sizes) <= 4  # batchSize of the model config
    # Batches form when the worker is free, as in TorchServe: with 8 clients and batchSize 4
    # most requests run in full batches (Ray's @serve.batch closes them as requests arrive).
    assert sum(s for s in sizes if s == 4) >= 0.75 * sum(sizes), sizes


def test_serve_batch_mode_answers_the_same(served: Served) -> None:
    jobs = [IMAGES[i % len(IMAGES)] for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: served.post("/sb/predictions/described", p,
                                                      "image/png" if p.suffix == ".png" else "image/jpeg"), jobs))
    for path, (status, _, body) in zip(jobs, answers):
        assert status == 200, body
        _assert_same(json.loads(body), _expected("image_classifier", path))
    assert max(served.handles["sb"].stats.remote().result()["batch_sizes"]) > 1


def _get(served: Served, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(served.base + path, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_describe_answers_as_torchserve_management_api(served: Served) -> None:
    from _ts_server import DESCRIBE_KEYS, WORKER_KEYS

    status, body = _get(served, "/models/image_classifier")
    assert status == 200, body
    (model,) = body
    assert tuple(model) == DESCRIBE_KEYS and tuple(model["workers"][0]) == WORKER_KEYS, model
    assert (model["modelName"], model["batchSize"], model["maxBatchDelay"], model["deviceType"]) == (
        "image_classifier", 4, 50, "cpu")
    assert model["workers"][0]["status"] == "READY" and model["workers"][0]["gpu"] is False
    assert model["workers"][0]["pid"] == served.handles["hk"].stats.remote().result()["pid"]
    # customized=true asks the handler (describe: True, batch of one); None adds no key.
    status, body = _get(served, "/models/image_classifier?customized=true")
    assert status == 200 and "customizedMetadata" not in body[0], body
    status, body = _get(served, "/sb/models/described/1.0?customized=true")
    assert status == 200, body
    assert tuple(body[0])[-1] == "customizedMetadata" and body[0]["customizedMetadata"] == {"kind": "shapes", "classes": 5}
    assert _get(served, "/models/nope")[0] == 404
    status, body = _get(served, "/models/image_classifier/9.9")
    assert status == 404 and body["type"] == "ModelVersionNotFoundException"
    status, _, body = served.post("/models/image_classifier", b"")
    assert status == 405, body


def test_a_corrupt_image_fails_alone_with_its_own_4xx(served: Served) -> None:
    good = IMAGES[:3]
    items: list[Path] = [good[0], TRUNCATED, good[1], good[2]] * 2

    def send(p: Path) -> tuple[int, dict, bytes]:
        return served.post("/predictions/image_classifier", p, "image/png" if p.suffix == ".png" else "image/jpeg")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, items))
    for path, (status, _, body) in zip(items, results):
        if path == TRUNCATED:
            assert status == 400, body
            error = json.loads(body)
            assert set(error) == {"code", "error", "fix"} and error["code"] == 400
        else:
            assert status == 200, body
            _assert_same(json.loads(body), _expected("image_classifier", path))


def test_torchserve_own_image_classifier_runs_unchanged(served: Served) -> None:
    image = IMAGES[0]
    status, _, body = served.post("/ts/predictions/ts_classifier", image, "image/png")
    assert status == 200, body
    _assert_same(json.loads(body), _expected("ts.torch_handler.image_classifier", image))


def test_routes_ping_unknown_model_and_version(served: Served) -> None:
    with urllib.request.urlopen(served.base + "/ping", timeout=30) as resp:
        assert json.loads(resp.read()) == {"status": "Healthy"}
    status, _, body = served.post("/predictions/nope", IMAGES[0], "image/png")
    assert status == 404 and json.loads(body)["type"] == "ModelNotFoundException"
    status, _, body = served.post("/predictions/image_classifier/9.9", IMAGES[0], "image/png")
    assert status == 404, body
    status, _, _ = served.post("/predictions/image_classifier/1.0", IMAGES[0], "image/png")
    assert status == 200


# -- the translation, without Ray's HTTP ------------------------------------------------------


