"""Open Inference Protocol v2 servers nobody here wrote, started on loopback for a test.

:func:`child_server` runs a server command in its own process group, waits until
``GET /v2/health/live`` answers, and stops the whole group afterwards (SIGTERM, then SIGKILL
after a bounded wait). :func:`kserve_server` runs ``kserve.ModelServer`` that way on
127.0.0.1 (KServe 0.21 hard-codes ``host="0.0.0.0"`` in its REST server: the child narrows it
to loopback before starting), gRPC off. :func:`mlserver_server` runs ``mlserver start`` from
its own venv (``.venv-mlserver``) with a ``settings.json`` that keeps it on loopback.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from _ts_server import HOST, free_ports, tail

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
MLSERVER = ROOT / ".venv-mlserver" / "bin" / "mlserver"
MLSERVER_INSTALL = (
    "python3 -m venv .venv-mlserver && .venv-mlserver/bin/pip install -c .ci/mlserver-constraints.txt mlserver==1.7.1"
)
START_TIMEOUT_S = 60


def _live(port: int) -> bool:
    connection = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        connection.request("GET", "/v2/health/live")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


@contextlib.contextmanager
def child_server(
    command: list[str], port: int, log: Path, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Iterator[str]:
    """``command`` started in its own process group; yields ``http://127.0.0.1:port`` once the
    server is live; the group is stopped at the end whatever happened."""
    with open(log, "wb") as out:
        child = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _live(port):
            if child.poll() is not None:
                pytest.fail(f"{command[0]} exited with {child.returncode}:\n{tail(log)}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"{command[0]} not live after {START_TIMEOUT_S} s:\n{tail(log)}", pytrace=False)
            time.sleep(0.2)
        yield f"http://{HOST}:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)


_KSERVE_CHILD = """\
import sys
sys.path.insert(0, {tests!r})
from kserve.protocol.rest import server as rest

_init = rest.RESTServer.__init__


def _loopback(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.config.host = {host!r}  # KServe 0.21 hard-codes 0.0.0.0; uvicorn reads the host at start


rest.RESTServer.__init__ = _loopback
import kserve

{setup}
kserve.ModelServer(http_port={port}, enable_grpc=False, workers=1, grace_period=1).start(models)
"""


@contextlib.contextmanager
def kserve_server(setup: str, tmp_path: Path) -> Iterator[str]:
    """``kserve.ModelServer`` on loopback serving ``models``, a list that the Python code
    ``setup`` defines (``tests/`` is importable there); yields its base URL."""
    (port,) = free_ports(1)
    script = tmp_path / "kserve_child.py"
    script.write_text(_KSERVE_CHILD.format(tests=str(TESTS), host=HOST, setup=textwrap.dedent(setup), port=port))
    # KServe parses sys.argv at import (model_server.args): the child gets none of pytest's.
    with child_server([sys.executable, str(script)], port, tmp_path / "kserve.log", cwd=tmp_path) as url:
        yield url


def require_mlserver() -> None:
    """Skip with the reason and the install command where ``.venv-mlserver`` is missing; a
    failure instead under ``HANDLERKIT_REQUIRE_MLSERVER=1`` (CI's ``.ci/run``)."""
    if MLSERVER.is_file():
        return
    reason = f"needs MLServer 1.7.1 in its own venv: {MLSERVER_INSTALL}"
    if os.environ.get("HANDLERKIT_REQUIRE_MLSERVER") == "1":
        pytest.fail(f"HANDLERKIT_REQUIRE_MLSERVER=1 but {MLSERVER} is missing; {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def mlserver_server(tmp_path: Path, model: Mapping[str, object]) -> Iterator[str]:
    """``mlserver start`` serving one model (its ``model-settings.json`` as ``model``; its
    runtime importable from ``tests/``) on loopback: HTTP and gRPC on free ports, metrics off,
    the model run in the server's own process; yields the base URL."""
    http_port, grpc_port, metrics_port = free_ports(3)
    root = tmp_path / "mlserver"
    (root / str(model["name"])).mkdir(parents=True)
    settings = {
        "host": HOST,
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,  # unused: metrics_endpoint null turns the metrics server off
        "metrics_endpoint": None,
        "parallel_workers": 0,
        "debug": False,
    }
    (root / "settings.json").write_text(json.dumps(settings))
    (root / str(model["name"]) / "model-settings.json").write_text(json.dumps(model))
    env = {"PYTHONPATH": str(TESTS)}
    with child_server([str(MLSERVER), "start", str(root)], http_port, tmp_path / "mlserver.log", env=env) as url:
        yield url
