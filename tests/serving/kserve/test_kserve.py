"""The KServe adapter on a live local KServe model server (``handlerkit.serving.kserve``).

One server per module (a child process on 127.0.0.1, ~3 s to start) serves the shapes classifier
(``fixtures/models/image_classifier``) archived with the real ``torch-model-archiver`` around a
handler file that subclasses handlerkit's ImageClassifier unchanged; a second serves a tabular
handler unlike the fixtures (numbers in, a dict out). Requests go through ``http.client``, and
through ``tritonclient``'s HTTP client, a v2 client nobody here wrote.

**The real-server comparison**: the same ``.mar`` under a real TorchServe 0.12 started with
``service_envelope=kservev2`` (and again with ``kserve``). TorchServe 0.12's frontend routes
KServe's URLs itself (``InferenceRequestHandler``: ``/v2/models/<m>/infer`` →
``handleKFV2Predictions``, ``/v1/models/<m>:predict`` → ``handleKFV1Predictions``; both add
``explain`` and forward the body as it came), so the same requests are posted to the same URL on
both servers and must get the same answers: v1 the same status and bytes, v2 the same status and
document but for the ``"parameters": null`` fields kserve's response model adds, and a v2 error
the same status with TorchServe's message as the spec's ``{"error": ...}``.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _ts_server import TorchServe, archive, missing_requirements

from handlerkit.service import Service
from handlerkit.serving.kserve import KServeServer, model, start
from handlerkit.worker.clients import request as envelope_request

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = ROOT / "fixtures" / "models" / "image_classifier"
IMAGES = ROOT / "fixtures" / "images"
NOT_AN_IMAGE = ROOT / "fixtures" / "bad" / "not_an_image.txt"
JSON = {"Content-Type": "application/json"}

SHAPES_HANDLER = '''\
"""handlerkit's ImageClassifier, unchanged (tests/serving/kserve/test_kserve.py)."""
from handlerkit.handlers.image_classifier import ImageClassifier


class ShapesHandler(ImageClassifier):
    pass
'''

#: GET /v2/models/shapes: ImageClassifier.v2_metadata.
SHAPES_METADATA = {
    "name": "shapes", "versions": None, "platform": "",
    "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "input-0", "datatype": "BYTES", "shape": [1]}],
}  # fmt: skip

#: Numbers in, a dict out: under v1 one row per instance, under v2 one input (a 2-D tensor) each.
TABULAR_HANDLER = '''\
class Tabular:
    def initialize(self, context):
        self.name = context.model_name

    def handle(self, data, context):
        out = []
        for item in data:
            rows = item["data"] if isinstance(item, dict) else [item]
            values = [float(x) for row in rows for x in row]
            if -1 in values:
                raise ValueError("a row asks to fail")
            if not values:
                context.set_response_status(422, "no values", 0)
                return [{"error": "an empty row"}]
            out.append({"model": self.name, "n": len(values), "sum": sum(values), "max": max(values)})
        return out
'''


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def _tensor(path: Path) -> np.ndarray:
    """The image as the handler's own preprocess makes it (resized, normalised): what a client
    sending tensors sends."""
    with Service.open(MODEL_DIR) as svc:
        svc.initialize()
        batch = svc.handler.preprocess([{"data": path.read_bytes()}])
    return batch[0].numpy()


def _post(port: int, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    return _call(port, "POST", path, data, headers if headers is not None else JSON)


def _call(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _get(port: int, path: str) -> tuple[int, Any]:
    status, _, body = _call(port, "GET", path)
    return status, json.loads(body)


def _v2_image(name: str, path: Path, rid: str) -> dict[str, Any]:
    return {"id": rid, "inputs": [{"name": name, "shape": [1], "datatype": "BYTES", "data": [_b64(path)]}]}


def _v2_tensor(path: Path, rid: str) -> dict[str, Any]:
    t = _tensor(path)
    return {"id": rid, "inputs": [{"name": "pixels", "shape": list(t.shape), "datatype": "FP32", "data": t.reshape(-1).tolist()}]}


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def mar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    (src / "shapes_handler.py").write_text(SHAPES_HANDLER)
    return archive(
        name="shapes",
        version="1.0",
        model_file=MODEL_DIR / "model.py",
        serialized_file=MODEL_DIR / "model.pt",
        handler=src / "shapes_handler.py",
        extra_files=[MODEL_DIR / "index_to_name.json"],
        config_file=MODEL_DIR / "model-config.yaml",
        export_path=tmp_path_factory.mktemp("store"),
    )


@pytest.fixture(scope="module")
def server(mar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServeServer]:
    with start(mar, log=tmp_path_factory.mktemp("kserve") / "server.log", timeout=120) as running:
        yield running


@pytest.fixture(scope="module")
def tabular(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServeServer]:
    model_dir = tmp_path_factory.mktemp("tabular")
    (model_dir / "tabular.py").write_text(TABULAR_HANDLER)
    (model_dir / "MAR-INF").mkdir()
    manifest = {"runtime": "python", "model": {"modelName": "tabular", "handler": "tabular.py", "modelVersion": "2.0"}}
    (model_dir / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    with start(model_dir, name="numbers", timeout=120) as running:
        yield running


# ---------------------------------------------------------------------------------- the server
def test_server_listens_on_loopback_only_and_names_its_urls(server: KServeServer) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.v1_url == f"{server.url}/v1/models/shapes" and server.v2_url == f"{server.url}/v2/models/shapes"
    listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
    mine = [row.split()[1] for row in listening if row.split()[3] == "0A" and int(row.split()[1].split(":")[1], 16) == server.port]
    assert mine == [f"0100007F:{server.port:04X}"]  # 127.0.0.1 and nothing else; no gRPC port either
    assert "grpc" not in server.log.read_text().lower()


def test_health_readiness_and_metadata(server: KServeServer) -> None:
    assert _get(server.port, "/v2/health/live") == (200, {"live": True})
    assert _get(server.port, "/v2/health/ready") == (200, {"ready": True})
    assert _get(server.port, "/v2/models/shapes/ready") == (200, {"name": "shapes", "ready": True})
    assert _get(server.port, "/v1/models/shapes") == (200, {"name": "shapes", "ready": True})
    # An ImageClassifier (here a subclass) declares its tensors: an encoded image in, its top-k out.
    assert _get(server.port, "/v2/models/shapes") == (200, SHAPES_METADATA)
    status, body = _get(server.port, "/v2/models/nope/ready")
    assert status == 404 and body == {"error": "Model with name nope does not exist."}


def test_v1_predict_and_explain_answer_as_the_kserve_envelope(server: KServeServer, mar: Path) -> None:
    body = {"instances": [{"data": _b64(IMAGES / "circle.png")}]}
    status, _, raw = _post(server.port, "/v1/models/shapes:predict", body)
    assert status == 200, raw
    predictions = json.loads(raw)["predictions"]
    assert len(predictions) == 1 and max(predictions[0], key=predictions[0].get) == "circle"
    with Service.open(mar, envelope="kserve") as svc:  # the same handler in-process, same envelope
        svc.initialize()
        [expected] = svc.handle([envelope_request("kserve", [{"data": _b64(IMAGES / "circle.png")}])])
    assert json.loads(raw) == expected
    status, _, raw = _post(server.port, "/v1/models/shapes:explain", body)
    assert status == 200 and list(json.loads(raw)) == ["explanations"]
    assert np.asarray(json.loads(raw)["explanations"]).shape == (1, 3, 224, 224)


@pytest.mark.parametrize("image, label", [("circle.png", "circle"), ("star.jpg", "star")])
def test_v2_infer_a_bytes_image(server: KServeServer, image: str, label: str) -> None:
    status, headers, raw = _post(server.port, "/v2/models/shapes/infer", _v2_image("img", IMAGES / image, "req-1"))
    assert status == 200 and headers["content-type"] == "application/json", raw
    answer = json.loads(raw)
    assert (answer["id"], answer["model_name"], answer["model_version"]) == ("req-1", "shapes", "1.0")
    [out] = answer["outputs"]
    assert (out["name"], out["shape"], out["datatype"]) == ("img", [1], "BYTES")
    assert max(out["data"][0], key=out["data"][0].get) == label


def test_v2_infer_an_fp32_tensor(server: KServeServer) -> None:
    status, _, raw = _post(server.port, "/v2/models/shapes/infer", _v2_tensor(IMAGES / "square.png", "t-1"))
    assert status == 200, raw
    [out] = json.loads(raw)["outputs"]
    assert out["name"] == "pixels" and out["shape"] == [1]
    assert max(out["data"][0], key=out["data"][0].get) == "square"


def test_a_bad_request_is_answered_alone_with_its_status_and_message(server: KServeServer) -> None:
    # The handler's own 400 for one request, as the v2 spec's error: {"error": <the handler's message>}.
    status, headers, raw = _post(server.port, "/v2/models/shapes/infer", _v2_image("img", NOT_AN_IMAGE, "bad"))
    assert status == 400 and headers["content-type"] == "application/json" and list(json.loads(raw)) == ["error"]
    assert "is not an image PIL can read" in json.loads(raw)["error"]
    # A v2 input whose data does not fit its shape is refused before the handler runs.
    bad_shape = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    status, _, raw = _post(server.port, "/v2/models/shapes/infer", bad_shape)
    assert status == 400 and json.loads(raw)["error"].startswith(
        "invalid v2 inference request: input 'x' shape [2, 2] holds 4 elements, its data 3. Fix: send each input as {"
    )
    status, _, raw = _post(server.port, "/v2/models/shapes/infer", {"inputs": [{**bad_shape["inputs"][0], "datatype": "F32"}]})
    assert status == 400 and "input 'x' datatype 'F32' is none of BOOL, UINT8" in json.loads(raw)["error"]
    # FastAPI's 422 for a body that is no inference request is the spec's 400 {"error"} on v2 routes.
    status, _, raw = _post(server.port, "/v2/models/shapes/infer", {"id": "no inputs"})
    assert (status, json.loads(raw)["error"][:84]) == (400, "expected a v2 inference request, a JSON object with 'inputs': inputs: Field required")
    # The next good request is answered as if nothing happened.
    status, _, raw = _post(server.port, "/v2/models/shapes/infer", _v2_image("img", IMAGES / "triangle.png", "ok"))
    assert status == 200 and max(json.loads(raw)["outputs"][0]["data"][0], key=json.loads(raw)["outputs"][0]["data"][0].get) == "triangle"
    # kserve's own checks answer before the handler: malformed JSON.
    status, _, raw = _post(server.port, "/v1/models/shapes:predict", b"{not json", JSON)
    assert status == 400 and "Unrecognized request format" in json.loads(raw)["error"]


# ---------------------------------------------------------------------------------- tritonclient
def test_tritonclient_round_trip(server: KServeServer) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}", connection_timeout=30, network_timeout=60)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("shapes")
        assert client.get_model_metadata("shapes") == SHAPES_METADATA
        image = triton.InferInput("img", [1], "BYTES")
        image.set_data_from_numpy(np.array([_b64(IMAGES / "cross.png").encode()], dtype=np.object_))  # binary extension
        result = client.infer("shapes", [image], request_id="tc-1")
        [scores] = result.as_numpy("img")
        assert result.get_response()["id"] == "tc-1" and max(scores, key=scores.get) == "cross"
        pixels = triton.InferInput("pixels", [3, 224, 224], "FP32")
        pixels.set_data_from_numpy(_tensor(IMAGES / "circle.png"), binary_data=False)
        # Without binary data, KServe reads the body as JSON only under a JSON content type.
        result = client.infer("shapes", [pixels], headers=JSON)
        [scores] = result.as_numpy("pixels")
        assert max(scores, key=scores.get) == "circle"
        # A v2 error's message reaches the client: the adapter's own check, then the handler's.
        short = triton.InferInput("pixels", [1, 224, 224], "FP32")
        short.set_data_from_numpy(_tensor(IMAGES / "circle.png")[:1], binary_data=False)
        short.set_shape([2, 224, 224])  # tritonclient checks the shape when data is set, not after
        with pytest.raises(triton.InferenceServerException, match=r"input 'pixels' shape \[2, 224, 224\] holds 100352 elements, its data 50176") as info:
            client.infer("shapes", [short], headers=JSON)
        assert info.value.status() == "400"
        junk = triton.InferInput("img", [1], "BYTES")
        junk.set_data_from_numpy(np.array([_b64(NOT_AN_IMAGE).encode()], dtype=np.object_))
        with pytest.raises(triton.InferenceServerException, match="is not an image PIL can read") as info:
            client.infer("shapes", [junk])
        assert info.value.status() == "400"
    finally:
        client.close()


# ---------------------------------------------------------------------------------- a handler unlike the fixtures
def test_tabular_handler_through_v1_and_v2(tabular: KServeServer) -> None:
    status, _, raw = _post(tabular.port, "/v1/models/numbers:predict", {"instances": [[1, 2, 3], [4, 5, 6]]})
    assert status == 200, raw
    assert json.loads(raw) == {"predictions": [
        {"model": "tabular", "n": 3, "sum": 6.0, "max": 3.0},
        {"model": "tabular", "n": 3, "sum": 15.0, "max": 6.0},
    ]}  # fmt: skip
    body = {"id": "t", "inputs": [{"name": "table", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]}]}
    status, _, raw = _post(tabular.port, "/v2/models/numbers/infer", body)
    assert status == 200, raw
    answer = json.loads(raw)
    assert (answer["model_name"], answer["model_version"]) == ("tabular", "2.0")  # the manifest's, as TorchServe
    assert answer["outputs"] == [
        {"name": "table", "shape": [1], "datatype": "BYTES", "parameters": None,
         "data": [{"model": "tabular", "n": 4, "sum": 10.0, "max": 4.0}]},
    ]  # fmt: skip
    # The handler's own per-request status.
    status, _, raw = _post(tabular.port, "/v1/models/numbers:predict", {"instances": [[]]})
    assert status == 422 and json.loads(raw) == {"predictions": [{"error": "an empty row"}]}


def test_a_handler_that_raises_gets_torchserves_503_and_its_stage_error_in_the_log(tabular: KServeServer) -> None:
    status, _, raw = _post(tabular.port, "/v1/models/numbers:predict", {"instances": [[1, -1]]})
    assert (status, json.loads(raw)) == (503, {"code": 503, "type": "InternalServerException", "message": "Prediction failed"})
    status, _, raw = _post(tabular.port, "/v2/models/numbers/infer",
                           {"inputs": [{"name": "t", "shape": [1, 1], "datatype": "INT64", "data": [-1]}]})  # fmt: skip
    assert (status, json.loads(raw)) == (503, {"error": "Prediction failed"})  # v2: the spec's error body
    log = tabular.log.read_text()
    assert log.count('numbers answered 503 "Prediction failed" to request') == 2, log[-3000:]
    assert "ValueError: a row asks to fail" in log and "tabular.py:11: raise ValueError" in log, log[-3000:]
    status, _, raw = _post(tabular.port, "/v1/models/numbers:predict", {"instances": [[7]]})  # the next one works
    assert status == 200 and json.loads(raw)["predictions"][0]["sum"] == 7.0


def test_model_is_a_kserve_model_that_loads_once() -> None:
    import kserve

    served = model(MODEL_DIR, name="direct")
    assert isinstance(served, kserve.Model) and served.name == "direct" and not served.ready
    try:
        assert served.load() and served.ready and served.service is not None
    finally:
        served.stop()
    assert not served.ready and served.service is None


def test_v2_inputs_are_checked_against_the_inputs_a_model_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subclass (or a patch) that declares inputs in the metadata gets them enforced, in-process."""
    import asyncio

    from kserve.protocol.infer_type import InferInput, InferRequest

    from handlerkit.serving.kserve._model import HandlerReply

    served = model(MODEL_DIR, name="declared")
    monkeypatch.setattr(served, "get_input_types", lambda: [{"name": "img", "datatype": "BYTES", "shape": [-1]}])
    served.load()
    try:
        def infer(name: str) -> Any:
            request = InferRequest("declared", [InferInput(name, [1], "BYTES", [_b64(IMAGES / "star.jpg")])])
            return asyncio.run(served.postprocess(asyncio.run(served.predict(request)), {}))

        assert max(infer("img")["outputs"][0]["data"][0], key=infer("img")["outputs"][0]["data"][0].get) == "star"
        with pytest.raises(HandlerReply) as info:
            infer("image")
        assert info.value.reply.status == 400 and json.loads(info.value.reply.body)["error"].startswith(
            "invalid v2 inference request: input 'image' is not one of the model's inputs (img). Fix:"
        )
    finally:
        served.stop()


def test_a_model_never_loaded_still_removes_its_unpacked_archive(mar: Path) -> None:
    served = model(mar)
    unpacked = Path(served.context.system_properties["model_dir"])
    assert served.name == "shapes" and (unpacked / "shapes_handler.py").is_file()
    served.stop()
    assert not unpacked.exists()


def test_start_refuses_a_handler_object_and_reports_a_load_failure(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"a served handler is a spec string \(the server is another process\)"):
        start(MODEL_DIR, handler=object())  # type: ignore[arg-type]
    from handlerkit.errors import HandlerkitError

    with pytest.raises(HandlerkitError, match=r"exited with 1 before listening(.|\n)*no_such_handler") as info:
        start(MODEL_DIR, handler="no_such_handler.py", log=tmp_path / "log", timeout=60)
    assert info.value.fix == "read the log above: the handler's own error is there"


def test_a_missing_kserve_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "kserve", None)
    with pytest.raises(ImportError, match=r"handlerkit.serving.kserve needs kserve: pip install 'handlerkit\[kserve\]'"):
        model(MODEL_DIR)
    with pytest.raises(ImportError, match=r"pip install 'handlerkit\[kserve\]'"):
        start(MODEL_DIR)


# ---------------------------------------------------------------------------------- real TorchServe 0.12
_missing = missing_requirements()


def _comparable(status: int, raw: bytes) -> tuple[int, Any]:
    """Status and parsed body, without the ``"parameters": null`` kserve's response model adds."""
    body = json.loads(raw)
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if not (k == "parameters" and v is None)}
        if isinstance(body.get("outputs"), list):
            body["outputs"] = [{k: v for k, v in o.items() if not (k == "parameters" and v is None)} for o in body["outputs"]]
    return status, body


def _v1(*images: Path) -> dict[str, Any]:
    return {"instances": [{"data": _b64(image)} for image in images]}


#: service_envelope -> (the KServe route both servers answer, {label: body}).
COMPARED = {
    "kserve": ("/v1/models/shapes:predict", {
        "circle": _v1(IMAGES / "circle.png"),
        "two instances": _v1(IMAGES / "star.jpg", IMAGES / "square.png"),
        "not an image": _v1(NOT_AN_IMAGE),
    }),
    "kservev2": ("/v2/models/shapes/infer", {
        "circle": _v2_image("img", IMAGES / "circle.png", "a"),
        "star": _v2_image("picture", IMAGES / "star.jpg", "b"),
        "tensor": _v2_tensor(IMAGES / "triangle.png", "c"),
        "not an image": _v2_image("img", NOT_AN_IMAGE, "d"),
    }),
}  # fmt: skip


@pytest.mark.torchserve
@pytest.mark.server
@pytest.mark.skipif(_missing is not None, reason=f"real TorchServe server: {_missing}")
@pytest.mark.parametrize("envelope", list(COMPARED))
def test_same_answers_as_torchserve_with_the_same_envelope(server: KServeServer, mar: Path, tmp_path: Path, envelope: str) -> None:
    """v1 answers are the same bytes (the worker's ``json.dumps(indent=2)``); v2 answers the same
    document once kserve's ``"parameters": null`` are dropped."""
    path, requests = COMPARED[envelope]
    ts = TorchServe(root=tmp_path / "ts", models={"shapes": mar.name}, model_store=mar.parent,
                    properties={"service_envelope": envelope})  # fmt: skip
    try:
        ts.start(timeout=120)
        for label, body in requests.items():
            status, _, ours = _post(server.port, path, body)
            ts_status, _, theirs = _post(ts.inference_port, path, body)
            if envelope == "kserve":
                assert (status, ours) == (ts_status, theirs), f"{label}: {status} {ours[:300]!r} != {ts_status} {theirs[:300]!r}"
            elif ts_status != 200:  # a v2 error: TorchServe's status, its handler's message as {"error"}
                [item] = json.loads(theirs)["outputs"][0]["data"]
                assert (status, json.loads(ours)) == (ts_status, {"error": item["error"]}), label
            else:
                assert _comparable(status, ours) == _comparable(ts_status, theirs), label
    finally:
        ts.stop()


def test_the_server_stops_when_its_owner_dies(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (
        "from handlerkit.serving.kserve import start\n"
        f"server = start({str(MODEL_DIR)!r}, timeout=120)\n"
        "print(server.process.pid, flush=True)\n"
        "import time; time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(owner.stdout.readline())  # type: ignore[union-attr]
    finally:
        owner.send_signal(signal.SIGKILL)  # no clean-up code runs in the owner
        owner.wait(timeout=10)
        owner.stdout.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        time.sleep(0.2)
    alive = Path(f"/proc/{child}").exists() and "Z" not in _state(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the KServe server outlived the process that started it"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
