"""The real thing: one archive served by a live TorchServe 0.12 and run by handlerkit's Harness.

The shapes classifier (``fixtures/models/image_classifier``) is archived with the real
``torch-model-archiver`` around handler *files* that subclass handlerkit's ImageClassifier, so
the TorchServe worker imports handlerkit. One server (module-scoped, ~10-20 s to start) serves
three archives on loopback ports:

- ``shapes``: the fixture's model-config.yaml (batchSize 4, maxBatchDelay 50 ms);
- ``shapes_batched``: the same with maxBatchDelay 5 s, so that 4 concurrent requests are
  deterministically one batch (a full batch is sent as soon as it is full);
- ``tensor_output``: a handler whose postprocess returns a Tensor instead of a list.

Each server answer is compared with ``Harness(...).run(batch)`` on the same unpacked archive and
the same bytes: outputs, per-request response headers, and what happens on errors. The
handler reports, in response headers, the batch size it saw and which Python and which
handlerkit the worker runs.

The probabilities agree bit for bit (after the JSON round trip), alone and in a batch of 4;
the tests allow 1e-5. What TorchServe adds to handle()'s return value (pinned here):
- a 200 answer has an empty reason phrase and no Content-Type header (the handler set none);
  the body is the dict as ``json.dumps(indent=2)``;
- an exception in a handler is 503 ``{"code": 503, "type": "InternalServerException",
  "message": "Prediction failed"}``, except a PredictionException, which keeps its code and
  message: handlerkit's RequestError (a client's bad input) is one, with code 400. Either
  fails every request of the batch: good requests batched with a bad one get the same error.
  The Harness names the request at fault;
- a non-list return is 503 "Invalid model predict output" for the whole batch;
- ``/ping`` says Healthy while a model's worker is still loading: readiness is the worker's
  READY state in the management API.
"""

from __future__ import annotations

import json
import mimetypes
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ts_server import (
    DESCRIBE_KEYS,
    WORKER_KEYS,
    Response,
    TorchServe,
    archive,
    log_contains,
    missing_requirements,
    multipart,
    serving,
    tail,
)

_missing = missing_requirements()
pytestmark = [
    pytest.mark.torchserve,
    pytest.mark.server,
    pytest.mark.skipif(_missing is not None, reason=f"real TorchServe server: {_missing}"),
]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
MODEL_DIR = FIXTURES / "models" / "image_classifier"
IMAGES_DIR = FIXTURES / "images"
NOT_AN_IMAGE = FIXTURES / "bad" / "not_an_image.txt"
IMAGES = sorted(p.name for p in IMAGES_DIR.glob("*") if p.suffix in (".png", ".jpg", ".jpeg"))

ATOL = 1e-5
BATCHED_DELAY_MS = 5000
STARTUP_TIMEOUT_S = 120

#: handlerkit's ImageClassifier, unchanged but for response headers saying how big the batch
#: was, which Python and handlerkit run it, and every request header the handler saw (less the
#: three http.client adds by itself), so the frontend's own (url_path, explain) are compared too.
SHAPES_HANDLER = '''\
"""handlerkit's ImageClassifier, served by TorchServe (tests/integration/test_torchserve_server.py)."""
import json
import sys

import handlerkit
from handlerkit.handlers.image_classifier import ImageClassifier

TRANSPORT = ("Host", "Content-Length", "Accept-Encoding")


class ShapesHandler(ImageClassifier):
    def postprocess(self, data):
        out = super().postprocess(data)
        for idx in range(len(out)):
            seen = {k: v for k, v in self.context.get_all_request_header(idx).items() if k not in TRANSPORT}
            self.context.set_response_header(idx, "X-HK-Request-Headers", json.dumps(seen, sort_keys=True))
            self.context.set_response_header(idx, "X-HK-Batch-Size", str(len(out)))
            self.context.set_response_header(idx, "X-HK-Python", sys.executable)
            self.context.set_response_header(idx, "X-HK-Handlerkit", handlerkit.__file__)
        return out
'''

#: The bug handlerkit exists to catch before the server: postprocess returns a Tensor.
TENSOR_OUTPUT_HANDLER = '''\
"""postprocess returns the probabilities as a Tensor, not one item per request (a bug)."""
import torch.nn.functional as F

from handlerkit.handlers.image_classifier import ImageClassifier


class TensorOutput(ImageClassifier):
    def postprocess(self, data):
        return F.softmax(data, dim=1)
'''

SERVER_ERROR_BODY = {"code": 503, "type": "InternalServerException", "message": "Prediction failed"}


# ---------------------------------------------------------------------------------- fixtures
def _config(extra: dict[str, Any]) -> str:
    import yaml

    config = yaml.safe_load((MODEL_DIR / "model-config.yaml").read_text())
    config.update(extra)
    return yaml.safe_dump(config, sort_keys=False)


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> .mar in a fresh model store, each built by torch-model-archiver."""
    for name in ("model.py", "model.pt", "index_to_name.json", "model-config.yaml"):
        if not (MODEL_DIR / name).is_file():
            pytest.fail(f"fixture missing: {MODEL_DIR / name}; build it with `python -m fixtures.builder`")
    root = tmp_path_factory.mktemp("archives")
    store = root / "store"
    specs = {
        "shapes": ("shapes_handler.py", SHAPES_HANDLER, None),
        "shapes_batched": ("shapes_handler.py", SHAPES_HANDLER, {"maxBatchDelay": BATCHED_DELAY_MS}),
        "tensor_output": ("tensor_output.py", TENSOR_OUTPUT_HANDLER, None),
    }
    mars = {}
    for name, (handler_name, source, override) in specs.items():
        src = root / "src" / name
        src.mkdir(parents=True)
        (src / handler_name).write_text(source)
        config = MODEL_DIR / "model-config.yaml"
        if override:
            config = src / "model-config.yaml"
            config.write_text(_config(override))
        mars[name] = archive(
            name=name,
            version="1.0",
            model_file=MODEL_DIR / "model.py",
            serialized_file=MODEL_DIR / "model.pt",
            handler=src / handler_name,
            extra_files=[MODEL_DIR / "index_to_name.json"],
            config_file=config,
            export_path=store,
        )
    return mars


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, archives: dict[str, Path]) -> Iterator[TorchServe]:
    """One TorchServe for the module, stopped at the end whatever happened."""
    with serving(tmp_path_factory.mktemp("ts"), archives, STARTUP_TIMEOUT_S) as ts:
        yield ts


@pytest.fixture(scope="module")
def harnesses(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Harness per archive, on the archive unpacked as the frontend unpacks it."""
    import handlerkit as hk

    root = tmp_path_factory.mktemp("unpacked")
    out = {}
    for name, mar in archives.items():
        model_dir = root / name
        with zipfile.ZipFile(mar) as zf:
            zf.extractall(model_dir)
        ctx = hk.MockContext.from_model_dir(model_dir)
        h = hk.Harness(ctx.manifest["model"]["handler"], ctx)
        h.initialize()
        out[name] = h
    return out


# ---------------------------------------------------------------------------------- helpers
def _why(server: TorchServe, resp: Response | None = None) -> str:
    head = f"server answered: {resp}\n" if resp is not None else ""
    return head + server.diagnostics(lines=25)


# X-HK-Python is the interpreter's path, which differs in name between the worker
# (<venv>/bin/python3) and a pytest started as <venv>/bin/python; it has its own test.
_PROCESS_HEADERS = {"X-HK-Python"}


def _hk_headers(resp: Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers if k.startswith("X-HK-") and k not in _PROCESS_HEADERS}


def _local_headers(context: Any, idx: int) -> dict[str, str]:
    return {k: v for k, v in context.get_response_headers(idx).items() if k not in _PROCESS_HEADERS}


def assert_same_prediction(served: dict[str, float], local: dict[str, float], what: str) -> None:
    """Same labels, probabilities within ATOL, the same ranking wherever it is not a near-tie."""
    assert set(served) == set(local), f"{what}: labels differ: server {list(served)} vs harness {list(local)}"
    diffs = {label: abs(served[label] - local[label]) for label in served}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= ATOL, f"{what}: {worst} differs by {diffs[worst]:.2e}: server {served} vs harness {local}"
    ranked_served, ranked_local = list(served), list(local)
    for i, (a, b) in enumerate(zip(ranked_served, ranked_local)):
        if a != b:
            assert abs(local[a] - local[b]) <= ATOL, f"{what}: ranking differs at {i}: {ranked_served} vs {ranked_local}"


def _request(image: Path, mode: str) -> tuple[str, bytes, dict[str, str], Any]:
    """(method, body, headers) of one HTTP request and the handlerkit Request it is."""
    import handlerkit as hk

    data = image.read_bytes()
    content_type = mimetypes.guess_type(image.name)[0]
    if mode == "post-body":  # curl -H "Content-Type: image/png" --data-binary @img
        return "POST", data, {"Content-Type": content_type}, hk.Request.from_file(image)
    if mode == "put-body":  # curl -T img: a PUT, no Content-Type
        return "PUT", data, {}, hk.Request.from_bytes(data)
    if mode == "multipart":  # curl -F data=@img
        body, header = multipart({"data": (image.name, data, content_type)})
        return "POST", body, {"Content-Type": header}, hk.Request.from_file(image, name="data", headers={"Content-Type": header})
    raise ValueError(mode)


def _concurrently(server: TorchServe, model: str, bodies: list[tuple[bytes, dict[str, str]]]) -> list[Response]:
    """POST every body at once from its own thread; the answers in the same order."""
    barrier = threading.Barrier(len(bodies))
    results: list[Any] = [None] * len(bodies)

    def send(i: int) -> None:
        body, headers = bodies[i]
        try:
            barrier.wait(timeout=10)
            results[i] = server.predict(model, body, headers, timeout=30)
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=45)
    for i, r in enumerate(results):
        if not isinstance(r, Response):
            raise AssertionError(f"request {i} to {model} got no answer: {r!r}\n{_why(server)}")
    return results


# ---------------------------------------------------------------------------------- tests
def test_server_runs_this_venv_handlerkit_and_the_archived_config(server: TorchServe) -> None:
    import handlerkit

    image = IMAGES_DIR / IMAGES[0]
    resp = server.predict("shapes", image.read_bytes(), {"Content-Type": "image/png"})
    assert resp.status == 200, _why(server, resp)
    # The worker's interpreter is the one the launcher ran under: --python sys.executable.
    worker_python = Path(resp.header("X-HK-Python") or "")
    assert worker_python.parent == Path(sys.executable).parent, _why(server, resp)
    # The frontend prints its config at the start of ts_log.log, and each worker's command line.
    ts_log = (server.logs / "ts_log.log").read_text()
    assert f"Python executable: {worker_python}\n" in ts_log
    assert f"Worker cmdline: [{worker_python}, " in ts_log
    assert resp.header("X-HK-Handlerkit") == handlerkit.__file__, _why(server, resp)

    described = server.management("GET", "/models/shapes")
    assert described.status == 200, _why(server, described)
    (model,) = described.json()
    assert tuple(model) == DESCRIBE_KEYS and tuple(model["workers"][0]) == WORKER_KEYS, model
    assert (model["batchSize"], model["maxBatchDelay"]) == (4, 50), model
    assert model["deviceType"] == "cpu" and [w["status"] for w in model["workers"]] == ["READY"], model
    (batched,) = server.management("GET", "/models/shapes_batched").json()
    assert (batched["batchSize"], batched["maxBatchDelay"]) == (4, BATCHED_DELAY_MS), batched


@pytest.mark.parametrize("mode", ["post-body", "put-body", "multipart"])
@pytest.mark.parametrize("image", IMAGES)
def test_image_prediction_matches_harness(server: TorchServe, harnesses: dict[str, Any], image: str, mode: str) -> None:
    import handlerkit as hk

    method, body, headers, req = _request(IMAGES_DIR / image, mode)
    resp = server.predict("shapes", body, headers, method=method)
    assert resp.status == 200, _why(server, resp)

    h = harnesses["shapes"]
    run = h.run(hk.batch(req, decode=True))
    assert run.problems == []
    assert_same_prediction(resp.json(), run.output[0], f"{image} ({mode})")
    # The handler's response headers reach the client as set (and the batch was one request).
    assert _hk_headers(resp) == _local_headers(h.context, 0), _why(server, resp)
    assert resp.header("X-HK-Batch-Size") == "1"
    # TorchServe's own framing: body is json.dumps(item, indent=2); no Content-Type header when
    # the handler sets none (the Harness context has none either), and an empty reason phrase.
    assert resp.body == json.dumps(resp.json(), indent=2).encode()
    assert resp.header("Content-Type") is None and h.context.get_response_content_type(0) is None
    assert resp.reason == ""


def test_frontend_added_headers_match_the_harness(server: TorchServe, harnesses: dict[str, Any]) -> None:
    """TorchServe's frontend adds url_path (what follows /predictions/<model>/<version>/) and
    explain: "False" to every prediction request; hk.Request adds the same, so the handler sees
    the same header dict under the server and in the harness."""
    from _ts_server import request

    import handlerkit as hk

    image = IMAGES_DIR / "circle.png"
    resp = request(server.inference_port, "POST", "/predictions/shapes/1.0/v1/classify", image.read_bytes(), {"Content-Type": "image/png"})
    assert resp.status == 200, _why(server, resp)
    h = harnesses["shapes"]
    h.run(hk.batch(hk.Request.from_file(image, url_path="v1/classify")))
    served = json.loads(resp.header("X-HK-Request-Headers") or "{}")
    assert served == json.loads(h.context.get_response_headers(0)["X-HK-Request-Headers"]), _why(server, resp)
    assert served["url_path"] == "v1/classify" and served["explain"] == "False"


@pytest.mark.parametrize("content_type", ["application/octet-stream", "text/plain"])
def test_not_an_image_is_400_with_its_error_item_on_the_server_and_in_the_harness(
    server: TorchServe, harnesses: dict[str, Any], content_type: str
) -> None:
    import handlerkit as hk

    data = NOT_AN_IMAGE.read_bytes()
    resp = server.predict("shapes", data, {"Content-Type": content_type})
    # The built-in answers a bad request alone: its error item, with the status it set through
    # the context (TorchServe's own handler would fail the batch with a 503).
    assert resp.status == 400, _why(server, resp)
    body = resp.json()
    assert body["code"] == 400 and body["error"] and body["fix"]

    h = harnesses["shapes"]
    run = h.run(hk.batch(hk.Request.from_bytes(data, content_type), decode=True))
    assert run.output == [body]
    assert h.context.get_response_status(0)[0] == 400


def test_concurrent_requests_are_one_server_batch_matching_the_harness(
    server: TorchServe, harnesses: dict[str, Any]
) -> None:
    import handlerkit as hk

    images = [IMAGES_DIR / name for name in IMAGES[:4]]
    assert len(images) == 4, IMAGES
    requests = [_request(p, "post-body") for p in images]
    start = time.perf_counter()
    answers = _concurrently(server, "shapes_batched", [(body, headers) for _, body, headers, _ in requests])
    elapsed = time.perf_counter() - start
    for image, resp in zip(images, answers):
        assert resp.status == 200, _why(server, resp)
        assert resp.header("X-HK-Batch-Size") == "4", f"{image.name}: not batched by the server\n{_why(server, resp)}"
    # A full batch leaves at once; waiting out maxBatchDelay would mean it was not full.
    assert elapsed < BATCHED_DELAY_MS / 1000, f"{elapsed:.1f} s"

    h = harnesses["shapes_batched"]
    run = h.run(hk.batch(*[req for *_, req in requests], decode=True))
    assert run.problems == [] and len(run.output) == 4
    for i, (image, resp) in enumerate(zip(images, answers)):
        assert_same_prediction(resp.json(), run.output[i], f"{image.name} in a batch of 4")
        assert _hk_headers(resp) == _local_headers(h.context, i)


def test_one_bad_request_in_a_server_batch_fails_alone_as_in_the_harness(
    server: TorchServe, harnesses: dict[str, Any]
) -> None:
    import handlerkit as hk

    good = [_request(IMAGES_DIR / name, "post-body") for name in IMAGES[:3]]
    bad = NOT_AN_IMAGE.read_bytes()
    bodies = [(body, headers) for _, body, headers, _ in good] + [(bad, {"Content-Type": "application/octet-stream"})]
    answers = _concurrently(server, "shapes_batched", bodies)
    # The three good images get their predictions, the bad one its own 400 (TorchServe's own
    # handlers fail the whole batch).
    assert [r.status for r in answers] == [200, 200, 200, 400], _why(server, answers[-1])

    batch = hk.batch(*[req for *_, req in good], hk.Request.from_bytes(bad, "application/octet-stream"), decode=True)
    h = harnesses["shapes_batched"]
    run = h.run(batch)
    assert [h.context.get_response_status(i)[0] for i in range(4)] == [200, 200, 200, 400]
    for i, name in enumerate(IMAGES[:3]):
        assert_same_prediction(answers[i].json(), run.output[i], f"{name} next to a bad request")
    assert answers[3].json() == run.output[3] and run.output[3]["code"] == 400


def test_tensor_from_postprocess_is_503_on_the_server_and_an_output_type_problem_in_the_harness(
    server: TorchServe, harnesses: dict[str, Any]
) -> None:
    import handlerkit as hk

    image = IMAGES_DIR / IMAGES[0]
    resp = server.predict("tensor_output", image.read_bytes(), {"Content-Type": "image/png"})
    assert resp.status == 503, _why(server, resp)
    assert resp.json() == {**SERVER_ERROR_BODY, "message": "Invalid model predict output"}
    assert log_contains(server.logs / "model_log.log", "Invalid return type"), tail(server.logs / "model_log.log", 200)

    with pytest.warns(hk.HandlerkitWarning, match="Invalid model predict output"):
        run = harnesses["tensor_output"].run(hk.batch(hk.Request.from_file(image), decode=True))
    checks = [p.check for p in run.problems]
    assert checks == ["output-type"], run.problems
    assert run.problems[0].stage == "postprocess"
