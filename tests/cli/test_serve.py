"""``handlerkit serve`` as an operator runs it: a busy port refused before Ray starts, a handler
that fails to load stopping the command, a failed request logged once on the console, a clean
stop that prints no failure. The last two start a real local Ray instance each (loopback only);
``tests/serving/test_replica.py`` covers what the served model answers.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from _serving import BROKEN_CLASS

import handlerkit as hk
from handlerkit.cli import main

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures" / "models" / "image_classifier"

#: What Ray prints when its Serve instance is stopped with serve.shutdown() (see cli/serve.py).
RAY_STOP_NOISE = ("graceful_shutdown", "killed by `ray.kill`", "Traceback")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*argv: object) -> list[str]:
    return [sys.executable, "-m", "handlerkit.cli", "serve", *map(str, argv)]


# -- a busy port, without Ray --------------------------------------------------------------


@pytest.mark.parametrize("reuse_port", [False, True], ids=["plain", "so_reuseport"])
def test_a_port_in_use_is_refused_naming_what_holds_it(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, reuse_port: bool) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is even imported
    with socket.socket() as listener:
        if reuse_port:  # as Ray's HTTP proxy listens: a second proxy would share the port
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = main(["serve", str(MODEL), "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert re.fullmatch(
        rf"handlerkit: error: port {port} on 127\.0\.0\.1 is already in use by pid {os.getpid()} \(.*python.*\): "
        r"stop it, or serve on another --port\n", err), err


# -- with a local Ray instance -------------------------------------------------------------



DOUBLING = '''def handle(data, context):
    if data is None:  # TorchServe's load call
        return None
    if "fail" in data:
        raise ValueError("an instance asks to fail")
    return [x * 2 for x in data]
'''


def _model_dir(path: Path, handler: str) -> Path:
    """A model dir of ``handler.py`` and its manifest."""
    (path / "MAR-INF").mkdir(parents=True)
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(
        {"runtime": "python", "model": {"modelName": path.name, "handler": "handler.py", "modelVersion": "1.0"}}))
    (path / "handler.py").write_text(handler)
    return path


@pytest.mark.ray
def test_a_handler_that_fails_to_load_stops_serve_with_its_stage_error(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "broken", BROKEN_CLASS)
    start = time.monotonic()
    done = subprocess.run(_serve(model, "--port", _free_port(), "--num-cpus", 2, "--for", 60),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr
    assert "serving" not in done.stdout
    # The notebook's StageError, last, as the command's one error.
    assert done.stderr.endswith(
        "handlerkit: error: initialize failed in Broken: TypeError: 'NoneType' object is not iterable\n"
        f"  at {model / 'handler.py'}:6: for label in self.labels:\n"
        "  fix: check the model dir, manifest and model-config.yaml the context points at\n"), done.stderr[-2000:]
    assert (model / "tries.txt").read_text().splitlines() == ["try"]  # no restart loop
    assert time.monotonic() - start < 200


def _post_json(url: str, document: Any) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(document).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.ray
def test_serve_logs_a_failed_request_once_answers_the_envelope_and_stops_quietly(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "doubling", DOUBLING)
    port = _free_port()
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(_serve(model, "--envelope", "json", "--port", port, "--num-cpus", 2, "--for", 15),
                                stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            line = proc.stdout.readline()  # the URL line, once serving (or EOF on failure)
            url = f"http://127.0.0.1:{port}/predictions/doubling"
            assert url in line, (line, err_path.read_text())
            # --envelope json answers as the Harness does with envelope="json".
            status, body = _post_json(url, {"instances": [1, 2, 3]})
            harness = hk.Harness.open(model, envelope="json")
            expected = harness.run(hk.batch(hk.Request.json({"instances": [1, 2, 3]}))).output[0]
            assert (status, body.decode()) == (200, expected) and json.loads(expected) == {"predictions": [2, 4, 6]}
            # A failing request: TorchServe's answer to the client, the StageError on the console.
            status, body = _post_json(url, {"instances": ["fail"]})
            assert (status, json.loads(body)) == (
                503, {"code": 503, "type": "InternalServerException", "message": "Prediction failed"})
            rest, _ = proc.communicate(timeout=120)  # --for 15: the command stops by itself
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr
    assert stderr.count("handle failed in handle for request 0: ValueError: an instance asks to fail") == 1, stderr
    assert f"at {model / 'handler.py'}:5: raise ValueError(\"an instance asks to fail\")" in stderr
    assert "fix: ValueError was raised at handler.py line 5" in stderr
    assert stderr.rstrip().endswith("handlerkit: stopped")
    for noise in RAY_STOP_NOISE:
        assert noise not in stderr and noise not in rest, noise


# -- --engine kserve ------------------------------------------------------------------------


def test_kserve_engine_prints_both_urls_serves_on_loopback_and_stops_on_sigterm(tmp_path: Path) -> None:
    import signal

    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(_serve(MODEL, "--engine", "kserve", "--port", 0, "--for", 120),
                                stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip
        try:
            lines = [proc.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
            assert lines[0] == "handlerkit: serving image_classifier on KServe (Ctrl-C to stop)\n", lines
            v1 = re.fullmatch(r"  v1: (http://127\.0\.0\.1:\d+/v1/models/image_classifier)  \(POST \1:predict, :explain\)\n", lines[1])
            v2 = re.fullmatch(r"  v2: (http://127\.0\.0\.1:\d+/v2/models/image_classifier)  \(POST \1/infer; GET .*/v2/health/ready\)\n", lines[2])
            assert v1 and v2, lines
            with urllib.request.urlopen(v2.group(1) + "/ready", timeout=10) as resp:
                assert json.loads(resp.read()) == {"name": "image_classifier", "ready": True}
            with urllib.request.urlopen(v1.group(1), timeout=10) as resp:
                assert json.loads(resp.read()) == {"name": "image_classifier", "ready": True}
            proc.send_signal(signal.SIGTERM)
            rest, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert proc.returncode == 0 and rest.startswith("served image_classifier at http://127.0.0.1:")
    assert (tmp_path / "err").read_text().endswith("handlerkit: interrupted\n")
    port = int(v2.group(1).split(":")[2].split("/")[0])
    from handlerkit.serving._ports import port_holder

    assert port_holder("127.0.0.1", port) is None  # the server is gone with the command


def test_kserve_engine_missing_names_the_extra(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kserve", None)
    assert main(["serve", str(MODEL), "--engine", "kserve"]) == 2
    assert capsys.readouterr().err == (
        "handlerkit: error: handlerkit serve --engine kserve needs kserve: pip install 'handlerkit[kserve]'\n")


@pytest.mark.parametrize("argv, message", [
    (["--host", "0.0.0.0"], "--engine kserve listens on 127.0.0.1 only: got --host 0.0.0.0; drop --host"),
    (["--envelope", "json"], "--envelope is for --engine ray: KServe's server runs on this machine"),
])  # fmt: skip
def test_kserve_engine_refuses_ray_options_and_public_hosts(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["serve", str(MODEL), "--engine", "kserve", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"handlerkit: error: {message}")
