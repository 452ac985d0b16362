"""What an operator sees when a handler fails on Ray Serve, against a real local Ray instance
(loopback only, 2 CPUs, one instance for the module; every replica here reserves no CPU).

- a failing batch is answered as TorchServe answers it, and its StageError (stage, request,
  ``file:line`` and source, fix) is in the replica's log once;
- a handler that fails to load fails the deployment at the first try, and ``run`` raises the
  StageError the notebook shows;
- a batch past ``responseTimeout`` is answered 500 "Worker died." and a fresh replica answers
  the next requests, as TorchServe restarts its worker.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray  # the `ray` extra is in the test extra: CI has it, and a missing ray fails
from _serving import BROKEN_CLASS
from ray import serve

from handlerkit.errors import HandlerLoadError, StageError
from handlerkit.serving.ray import app, run

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "fixtures" / "models" / "image_classifier"
CIRCLE = ROOT / "fixtures" / "images" / "circle.png"

FAILING = '''from handlerkit.handlers.image_classifier import ImageClassifier


class Failing(ImageClassifier):
    def preprocess(self, data):
        for row in data:
            if row.get("body") == "boom":
                raise ValueError("this request asks to fail")
        return super().preprocess(data)
'''
FAILING_LINE = 8

BROKEN_FUNCTION = '''def handle(data, context):
    with open("tries.txt", "a") as f:
        f.write("try\\n")
    if data is None:
        raise RuntimeError("no weights in the model dir")
    return data
'''

SLOW = '''import os
import time


class Slow:
    def initialize(self, context):
        self.pid = os.getpid()

    def preprocess(self, data):
        rows = [row.get("body") for row in data]
        if "sleep" in rows:
            time.sleep(30)
        return rows

    def handle(self, data, context):
        return [{"pid": self.pid} for _ in self.preprocess(data)]
'''
SLOW_LINE = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    # "local": never join a cluster some `ray start` left behind (ray.init's default would)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the port is picked after Ray's own processes have bound theirs, so none of them takes it
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _post(url: str, body: bytes, content_type: str, request_id: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": content_type, **({"x-request-id": request_id} if request_id else {})}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _model_dir(path: Path, files: dict[str, str], *, copy_classifier: bool = False) -> Path:
    """A copy of the fixture classifier with ``files`` added, or a model dir of ``files`` alone
    (``handler.py``, maybe ``model-config.yaml``) and their manifest."""
    if copy_classifier:
        shutil.copytree(MODEL, path)
    else:
        (path / "MAR-INF").mkdir(parents=True)
        model = {"modelName": path.name, "handler": "handler.py", "modelVersion": "1.0"}
        if "model-config.yaml" in files:
            model["configFile"] = "model-config.yaml"
        (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"runtime": "python", "model": model}))
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _log_text(logs: Path, app_name: str) -> str:
    return "".join(p.read_text() for p in sorted(logs.glob(f"replica_{app_name}_*.log")))


def test_a_failing_batch_is_answered_503_and_its_stage_error_logged_once(base: str, tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "failing", {"failing.py": FAILING}, copy_classifier=True)
    logs = tmp_path / "logs"
    # A long batch delay, so that the three requests below share one batch.
    run(app(model, handler="failing.py", name="failing", num_cpus=0, max_batch_delay_ms=500), name="failing",
        route_prefix="/failing", logging_config={"logs_dir": str(logs)})
    url = f"{base}/failing/predictions/failing"
    sends = [(CIRCLE.read_bytes(), "image/png", "req-good-1"), (b"boom", "text/plain", "req-boom"),
             (CIRCLE.read_bytes(), "image/png", "req-good-2")]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda s: _post(url, *s), sends))
    # TorchServe fails every request of the batch, with its error document.
    assert answers[1] == (503, {"code": 503, "type": "InternalServerException", "message": "Prediction failed"})
    assert all(status in (200, 503) for status, _ in answers)
    assert _post(url, CIRCLE.read_bytes(), "image/png")[0] == 200  # the replica serves on

    text = _log_text(logs, "failing")  # Serve flushes its replica log at every ERROR record
    assert text.count("preprocess failed in Failing") == 1, text
    header, stage_line, at, fix = re.search(
        r"failing answered 503 \"Prediction failed\" to (requests? [^\n]*):\n(preprocess failed in Failing for request "
        r"\d+: ValueError: this request asks to fail)\n(  at [^\n]*)\n(  fix: [^\n]*)", text).groups()
    # The request at fault is the one that sent "boom", however the batch was formed.
    ids = header.split(" ", 1)[1].split(", ")
    index = int(re.search(r"for request (\d+)", stage_line).group(1))
    assert ids[index] == "req-boom", (ids, index)
    assert at == f'  at {model / "failing.py"}:{FAILING_LINE}: raise ValueError("this request asks to fail")'
    # It fails alone where the others pass: what it sent is at fault, or the line that reads it.
    assert fix.startswith(f"  fix: request {index} fails preprocess alone where request "), fix
    assert fix.endswith(f"or correct failing.py line {FAILING_LINE} if it should be read"), fix
    serve.delete("failing")


@pytest.mark.parametrize("source", [BROKEN_CLASS, BROKEN_FUNCTION], ids=["initialize", "function-load-call"])
def test_a_handler_that_fails_to_load_raises_its_stage_error_at_the_first_try(base: str, tmp_path: Path,
                                                                                source: str) -> None:
    model = _model_dir(tmp_path / "broken", {"handler.py": source})
    start = time.monotonic()
    with pytest.raises(StageError, match=r"^initialize failed in (Broken|handle): ") as info:
        run(app(model, name="broken", num_cpus=0), name="broken", route_prefix="/broken")
    elapsed = time.monotonic() - start
    error = info.value
    expected = ("TypeError: 'NoneType' object is not iterable", 6) if source is BROKEN_CLASS else (
        "RuntimeError: no weights in the model dir", 5)
    assert expected[0] in error.message and error.stage == "initialize"
    assert error.location is not None and error.location[:2] == (str(model / "handler.py"), expected[1])
    assert f"at {model / 'handler.py'}:{expected[1]}:" in str(error) and error.fix
    # Ray's default would construct it again and again (20 tries); one replica started once.
    time.sleep(2)
    assert (model / "tries.txt").read_text().splitlines() == ["try"]
    assert elapsed < 60
    serve.delete("broken")


def test_a_handler_that_cannot_be_resolved_raises_its_handler_load_error(base: str, tmp_path: Path) -> None:
    with pytest.raises(HandlerLoadError, match=r"nope\.py") as info:
        run(app(MODEL, handler="nope.py", name="nope", num_cpus=0), name="nope", route_prefix="/nope")
    assert info.value.fix
    serve.delete("nope")


def test_a_batch_past_response_timeout_gets_worker_died_and_a_fresh_replica_answers_next(
        base: str, tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "slow", {"handler.py": SLOW, "model-config.yaml": "responseTimeout: 1\nbatchSize: 1\n"})
    logs = tmp_path / "logs"
    run(app(model, name="slow", num_cpus=0), name="slow", route_prefix="/slow", logging_config={"logs_dir": str(logs)})
    url = f"{base}/slow/predictions/slow"
    status, first = _post(url, b"ok", "text/plain")
    assert status == 200, first

    start = time.monotonic()
    # TorchServe answers the batch of a worker past responseTimeout so, and restarts the worker.
    assert _post(url, b"sleep", "text/plain", "req-sleep") == (
        500, {"code": 500, "type": "InternalServerException", "message": "Worker died."})
    assert time.monotonic() - start < 10  # answered at the timeout, not when the handler wakes up
    # The stuck replica answers at once until Ray has replaced it, and its ping says so.
    status, body = _post(url, b"ok", "text/plain")
    assert (status, body["type"]) == (503, "ServiceUnavailableException") and "being replaced" in body["message"]
    try:
        urllib.request.urlopen(f"{base}/slow/ping", timeout=30)
        pytest.fail("ping answered 200 while the replica waits to be replaced")
    except urllib.error.HTTPError as exc:
        assert (exc.code, json.loads(exc.read())) == (500, {"status": "Unhealthy"})

    deadline = time.monotonic() + 60
    while True:
        status, body = _post(url, b"ok", "text/plain")
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline, (status, body)
        time.sleep(0.5)
    assert body["pid"] != first["pid"]  # a fresh replica (a new worker process)

    text = _log_text(logs, "slow")
    assert text.count("answered 500 \"Worker died.\" to request req-sleep") == 1, text
    assert "preprocess failed in Slow for the batch: ResponseTimeout: no answer within responseTimeout (1 s)" in text
    assert f"  at {model / 'handler.py'}:{SLOW_LINE}: time.sleep(30)" in text
    assert "raise responseTimeout in model-config.yaml" in text
    serve.delete("slow")
