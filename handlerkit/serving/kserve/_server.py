"""A ``kserve.ModelServer`` for one model on loopback, in a process of its own.

KServe's ``ModelServer.start`` listens on every interface (``0.0.0.0`` for REST, ``[::]`` for
gRPC) with no option to change it. Here the server keeps KServe's own parts (its
``ModelServer``, data plane, model repository and ``RESTServer`` with the v1 and v2 routes) but
REST is handed a socket already bound to ``127.0.0.1`` (``RESTServer.run(sockets=...)``) and
gRPC is not started (``enable_grpc=False``). The child binds the port itself (``0``: any free
one) and reports it on its stdout, so no other process can take it in between.

The child is its own process because kserve is made to be one: it parses ``sys.argv`` when
imported, configures logging, and registers its routes on one module-level FastAPI app.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from handlerkit.errors import HandlerkitError

__all__ = ["KServeServer", "main", "start"]

HOST = "127.0.0.1"
_READY = "handlerkit-kserve listening "  # the child's line on stdout once its socket is bound


class KServeServer:
    """A running KServe model server: its URLs, its log, and :meth:`stop` (or a ``with`` block)."""

    def __init__(self, process: subprocess.Popen[str], port: int, name: str, log: Path) -> None:
        self.process, self.port, self.name, self.log = process, port, name, log
        #: ``http://127.0.0.1:PORT``
        self.url = f"http://{HOST}:{port}"
        #: ``GET`` readiness; ``POST`` ``:predict`` and ``:explain`` (KServe v1).
        self.v1_url = f"{self.url}/v1/models/{name}"
        #: ``GET`` metadata; ``GET /ready``, ``POST /infer`` (Open Inference Protocol v2).
        self.v2_url = f"{self.url}/v2/models/{name}"

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM (uvicorn shuts down gracefully), then SIGKILL after ``timeout`` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> KServeServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.process.poll() is None else f"exited {self.process.returncode}"
        return f"<KServeServer {self.name} at {self.url} ({state})>"


def start(
    model: str | os.PathLike[str],
    *,
    handler: str | None = None,
    name: str | None = None,
    port: int = 0,
    timeout: float = 120,
    log: str | os.PathLike[str] | None = None,
) -> KServeServer:
    """Start ``kserve.ModelServer`` serving ``model`` on 127.0.0.1 in a child process; returns
    once the model answers ``/v2/models/<name>/ready``.

    Args:
        model: a model dir or a ``.mar``.
        handler: a handler spec string (the manifest's handler by default).
        name: the model name in URLs (default: the manifest's ``modelName``).
        port: the HTTP port (0: a free one).
        timeout: seconds to wait for the model to be ready.
        log: where the server's output goes (default: a temporary file, :attr:`KServeServer.log`).

    Raises:
        ImportError: kserve is not installed.
        HandlerkitError: the server exited or was not ready in time (the message ends with its log).
    """
    from handlerkit._optional import require

    require("kserve", feature="handlerkit.serving.kserve", extra="kserve")
    if handler is not None and not isinstance(handler, str):
        raise TypeError(f"a served handler is a spec string (the server is another process): got {handler!r}")
    path = os.path.abspath(os.fspath(model))
    log_path = Path(log) if log is not None else Path(tempfile.mkstemp(prefix="handlerkit-kserve-", suffix=".log")[1])
    # -c, not -m: the package's __init__ imports this module, and runpy warns about running it again.
    cmd = [sys.executable, "-c", "from handlerkit.serving.kserve._server import main; main()", path]
    cmd += ["--port", str(port)]
    cmd += ["--handler", handler] if handler else []
    cmd += ["--name", name] if name else []
    with open(log_path, "ab") as err:
        # The child's stdin is a pipe only this process writes to: when this process ends, however
        # it ends, the child reads end-of-file and stops (see main), so no server outlives its owner.
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        line = process.stdout.readline() if process.stdout is not None else ""  # the child's first line
        if not line.startswith(_READY):
            process.wait(timeout=10)
            raise _failed(f"the KServe server for {path} exited with {process.returncode} before listening", log_path)
        bound = json.loads(line[len(_READY) :])
        server = KServeServer(process, int(bound["port"]), str(bound["name"]), log_path)
        _wait_ready(server, deadline)
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        raise
    return server


def _wait_ready(server: KServeServer, deadline: float) -> None:
    last = "no answer yet"
    while True:
        if server.process.poll() is not None:
            raise _failed(f"the KServe server exited with {server.process.returncode}; last: {last}", server.log)
        try:
            conn = http.client.HTTPConnection(HOST, server.port, timeout=5)
            try:
                conn.request("GET", f"/v2/models/{server.name}/ready")
                resp = conn.getresponse()
                last = f"{resp.status} {resp.read()[:200]!r}"
                if resp.status == 200:
                    return
            finally:
                conn.close()
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise _failed(f"the KServe model {server.name!r} was not ready in time; last: {last}", server.log)
        time.sleep(0.2)


def _failed(message: str, log: Path) -> HandlerkitError:
    try:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    except OSError:
        tail = "(no log)"
    return HandlerkitError(
        f"{message}\n----- {log} -----\n{tail}", fix="read the log above: the handler's own error is there"
    )


# -- the child process ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """The child: load the model, bind 127.0.0.1:PORT, report it on stdout, serve until SIGTERM."""
    parser = argparse.ArgumentParser(prog="handlerkit.serving.kserve._server")
    parser.add_argument("model")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--handler")
    parser.add_argument("--name")
    args = parser.parse_args(argv)
    sys.argv = sys.argv[:1]  # kserve parses sys.argv when imported: give it none of ours
    import kserve
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
    from kserve.protocol.rest.server import RESTServer

    from handlerkit.serving.frontend.failure_answers import logger
    from handlerkit.serving.kserve._model import HandlerModel

    handler = logging.StreamHandler()  # to the server's log (its stderr): a failed request's StageError
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    served = HandlerModel(args.model, handler=args.handler, name=args.name, working_dir="process")
    served.load()  # initialize once; a handler that fails to load ends the process with its error
    server = kserve.ModelServer(http_port=args.port, enable_grpc=False, enable_latency_logging=False)
    server.register_model(served)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, args.port))
    rest = RESTServer(
        FASTAPI_APP_IMPORT_STRING,
        server.dataplane,
        server.model_repository_extension,
        sock.getsockname()[1],
        grace_period=5,
    )
    threading.Thread(target=_stop_with_the_parent, name="handlerkit-parent-watch", daemon=True).start()
    print(_READY + json.dumps({"port": sock.getsockname()[1], "name": served.name}), flush=True)
    # Nobody reads this pipe past that line: the rest of stdout (uvicorn's access log, a line per
    # request) goes to the log with stderr, or the full pipe would block the server for good
    # (after ~600 requests).
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        rest.run(sockets=[sock])  # uvicorn: serves until SIGTERM/SIGINT
    finally:
        served.stop()


def _stop_with_the_parent() -> None:
    """SIGTERM this server once the parent's end of stdin closes (the parent stopped or died)."""
    try:
        sys.stdin.buffer.read()
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
