"""A tiny Open Inference Protocol v2 server in a thread, for the conformance check's tests.

By default it keeps every rule the check tests: it validates each request input against the
model's metadata (name, datatype, value types, ``data`` filling ``shape``) and answers errors
with 400 and ``{"error": ...}``. Each name in ``breaks`` makes it break one rule on purpose,
so every rule of the check can be seen to fail.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake-model"
INPUTS = [
    {"name": "features", "datatype": "FP32", "shape": [-1, 3]},
    {"name": "ids", "datatype": "INT64", "shape": [2]},
    {"name": "text", "datatype": "BYTES", "shape": [1]},
    {"name": "flags", "datatype": "BOOL", "shape": [-1]},
]
OUTPUTS = [{"name": "count", "datatype": "INT64", "shape": [-1]}]

BREAKS = (
    "live", "ready", "server_status", "server_fields", "metadata_status", "metadata_fields", "model_ready",
    "model_name", "id", "data_length", "no_outputs", "nested", "shape_unchecked", "datatype_unchecked",
    "json_500", "plain_errors", "inputs_optional", "unknown_200", "unknown_ready_200", "no_listing", "two_models",
)  # fmt: skip


def _flat(data: Any) -> list[Any]:
    return [v for item in data for v in _flat(item)] if isinstance(data, list) else [data]


def _type_ok(datatype: str, value: Any) -> bool:
    if datatype == "BYTES":
        return isinstance(value, str)
    if datatype == "BOOL":
        return isinstance(value, bool)
    if datatype.startswith("FP"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool)


def input_problem(request_input: dict[str, Any], declared: dict[str, dict[str, Any]], nested_ok: bool) -> str | None:
    meta = declared.get(request_input.get("name"))
    if meta is None:
        return f"unknown input {request_input.get('name')!r}"
    if request_input.get("datatype") != meta["datatype"]:
        return f"input {meta['name']} must be {meta['datatype']}"
    shape, data = request_input.get("shape"), request_input.get("data")
    if len(shape) != len(meta["shape"]) or any(m not in (-1, s) for m, s in zip(meta["shape"], shape)):
        return f"input {meta['name']} shape {shape} does not fit {meta['shape']}"
    if not nested_ok and any(isinstance(v, list) for v in data):
        return "nested data is not supported"
    values = _flat(data)
    if len(values) != math.prod(shape):
        return f"input {meta['name']}: shape {shape} needs {math.prod(shape)} values, got {len(values)}"
    if not all(_type_ok(meta["datatype"], v) for v in values):
        return f"input {meta['name']}: values are not {meta['datatype']}"
    return None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any = None, *, raw: bytes | None = None) -> None:
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if raw is None else "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _error(self, status: int, message: str) -> None:
        if "plain_errors" in self.server.breaks:
            self._send(status, raw=message.encode())
        else:
            self._send(status, {"error": message})

    def do_GET(self) -> None:
        breaks, path = self.server.breaks, self.path
        model = f"/v2/models/{MODEL}"
        if path == "/v2/health/live":
            self._send(503 if "live" in breaks else 200)
        elif path == "/v2/health/ready":
            self._send(503 if "ready" in breaks else 200)
        elif path == "/v2":
            if "server_status" in breaks:
                self._error(500, "no metadata today")
            elif "server_fields" in breaks:
                self._send(200, {"name": "fake"})
            else:
                self._send(200, {"name": "fake", "version": "0.1", "extensions": []})
        elif path == "/v2/models" and "no_listing" not in breaks:
            self._send(200, {"models": [MODEL, "other"] if "two_models" in breaks else [MODEL]})
        elif path == model:
            if "metadata_status" in breaks:
                self._error(500, "metadata broke")
                return
            inputs = [{**t, "datatype": "FLOAT"} for t in INPUTS] if "metadata_fields" in breaks else INPUTS
            self._send(200, {"name": MODEL, "versions": ["1"], "platform": "fake", "inputs": inputs, "outputs": OUTPUTS})
        elif path == f"{model}/ready":
            self._send(503 if "model_ready" in breaks else 200)
        elif path.startswith("/v2/models/"):
            if path.endswith("/ready"):
                self._send(200 if "unknown_ready_200" in breaks else 404)
            elif "unknown_200" in breaks:
                self._send(200, {"name": "anything"})
            else:
                self._error(404, f"no model {path.rsplit('/', 1)[-1]}")
        else:
            self._error(404, f"no route {path}")

    def do_POST(self) -> None:
        breaks = self.server.breaks
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != f"/v2/models/{MODEL}/infer":
            self._error(404, "no such model")
            return
        try:
            request = json.loads(body)
        except ValueError:
            self._error(500 if "json_500" in breaks else 400, "malformed JSON")
            return
        if "inputs" not in request:
            if "inputs_optional" in breaks:
                self._send(200, {"model_name": MODEL, "id": request.get("id"), "outputs": []})
            else:
                self._error(400, "inputs are required")
            return
        declared = {t["name"]: t for t in INPUTS}
        for request_input in request["inputs"]:
            problem = input_problem(request_input, declared, nested_ok="nested" not in breaks)
            if problem and not (
                ("shape_unchecked" in breaks and "needs" in problem)
                or ("datatype_unchecked" in breaks and ("must be" in problem or "are not" in problem))
            ):
                self._error(400, problem)
                return
        count = len(request["inputs"])
        output = {"name": "count", "datatype": "INT64", "shape": [2 if "data_length" in breaks else 1], "data": [count]}
        answer = {"model_name": "other" if "model_name" in breaks else MODEL, "outputs": [output]}
        if "id" not in breaks and "id" in request:
            answer["id"] = request["id"]
        if "no_outputs" in breaks:
            answer["outputs"] = []
        self._send(200, answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    breaks: frozenset[str] = frozenset()


@contextlib.contextmanager
def fake_v2_server(*breaks: str) -> Iterator[str]:
    """The fake server on a free loopback port, breaking ``breaks``; yields its base URL."""
    unknown = set(breaks) - set(BREAKS)
    if unknown:
        raise ValueError(f"no such break: {sorted(unknown)}")
    server = _Server(("127.0.0.1", 0), _Handler)
    server.breaks = frozenset(breaks)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
