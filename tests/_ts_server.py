"""A real TorchServe 0.12 on loopback, for ``tests/integration/test_torchserve_server.py``.

Everything a server run touches lives under one folder of the test's choosing: the model
store, ``config.properties``, the logs, the JVM's temp dir (where the frontend unpacks the
``.mar`` files and puts the workers' unix sockets) and the launcher's ``TMPDIR`` (where
``torchserve`` keeps its pid file, ``.model_server.pid``, which ``torchserve --stop`` reads). So
a test server never sees, reuses or stops another TorchServe on the machine.

How TorchServe picks the worker's Python: the ``torchserve`` launcher (``ts/model_server.py``)
passes ``--python sys.executable`` to the Java frontend, which overrides any ``python=`` line
of ``config.properties`` (``ConfigManager``), and the frontend starts every worker as
``<that python> .../ts/model_service_worker.py`` (``EnvironmentUtils.getPythonRunTime``; only
a model whose config says ``useVenv: true`` gets ``<its venv>/bin/python`` instead). ``sys.executable``
is the interpreter of the launcher script's shebang; we run the ``torchserve`` script that sits
next to this interpreter, so the workers run this very venv, and ``PATH`` starts with its
``bin`` for anything that runs a bare ``python``.

Requests go through ``http.client`` to 127.0.0.1 (never through a proxy), one connection per
request, each with a timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
#: The keys of one model in TorchServe 0.12's ``GET /models/<m>`` answer, in order (read from
#: the real server: test_torchserve_server pins it; the Ray adapter's describe must match).
DESCRIBE_KEYS = ("modelName", "modelVersion", "modelUrl", "runtime", "minWorkers", "maxWorkers", "batchSize",
                 "maxBatchDelay", "responseTimeout", "startupTimeout", "maxRetryTimeoutInSec", "clientTimeoutInMills",
                 "parallelType", "parallelLevel", "deviceType", "continuousBatching", "useJobTicket", "useVenv",
                 "stateful", "sequenceMaxIdleMSec", "sequenceTimeoutMSec", "maxNumSequence", "maxSequenceJobQueueSize",
                 "loadedAtStartup", "workers", "jobQueueStatus")
WORKER_KEYS = ("id", "startTime", "status", "memoryUsage", "pid", "gpu", "gpuUsage")
VENV_BIN = Path(sys.executable).parent

#: Environment variables that would change how the launcher, the frontend or the worker
#: behave behind the test's back; they are dropped from the server's environment.
_DROPPED_ENV = (
    "TS_CONFIG_FILE",  # the launcher prefers it over --ts-config
    "TS_DECODE_INPUT_REQUEST",  # the worker's input decoding; the Harness side decodes too
    "PYTHONSTARTUP",
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
)


def tool(name: str) -> str | None:
    """The executable ``name`` next to this interpreter (the venv), else on PATH."""
    candidate = VENV_BIN / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def java() -> str | None:
    """The ``java`` the launcher will run (``$JAVA_HOME/bin/java``, else ``java`` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def missing_requirements() -> str | None:
    """Why a real server cannot run here, or None."""
    if java() is None:
        home = os.environ.get("JAVA_HOME")
        if home:
            return f"JAVA_HOME={home} has no bin/java (TorchServe's frontend needs Java 11+)"
        return "no `java` on PATH (TorchServe's frontend needs Java 11+): install a JRE or set JAVA_HOME"
    for name in ("torchserve", "torch-model-archiver"):
        if tool(name) is None:
            return f"no `{name}` next to {sys.executable} or on PATH: pip install torchserve==0.12.0 torch-model-archiver==0.12.0"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that are free right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port_range(width: int, attempts: int = 50) -> int:
    """The first of ``width`` consecutive free loopback ports (TorchServe's worker ports)."""
    for _ in range(attempts):
        (start,) = free_ports(1)
        if start + width >= 65535:
            continue
        ok = True
        for port in range(start, start + width):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((HOST, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return start
    raise RuntimeError(f"no {width} consecutive free ports on {HOST}")


#: ts_log.log lines that are noise when a test fails (a metric line per request and more).
NOISE = ("TS_METRICS", "ACCESS_LOG", "MODEL_METRICS")


def tail(path: Path, lines: int = 40, max_chars: int = 6000, skip: Sequence[str] = ()) -> str:
    """The last lines of a text file without lines holding any of ``skip``."""
    if not path.is_file():
        return f"[{path.name}: not written]"
    text = path.read_text("utf-8", errors="replace")
    kept = [line for line in text.splitlines() if not any(s in line for s in skip)]
    return "\n".join(kept[-lines:])[-max_chars:]


def log_contains(path: Path, text: str, timeout: float = 15) -> bool:
    """Whether ``text`` appears in the log file within ``timeout`` seconds. The frontend writes
    a worker's output to its log asynchronously, so a line can land after the response."""
    deadline = time.monotonic() + timeout
    while True:
        if path.is_file() and text in path.read_text("utf-8", errors="replace"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# ------------------------------------------------------------------------------------ archives
def archive(
    *,
    name: str,
    version: str,
    model_file: Path,
    serialized_file: Path,
    handler: Path,
    extra_files: Sequence[Path],
    config_file: Path,
    export_path: Path,
    timeout: float = 120,
) -> Path:
    """Run the real ``torch-model-archiver``; returns the ``.mar``."""
    export_path.mkdir(parents=True, exist_ok=True)
    cmd = [
        tool("torch-model-archiver") or "torch-model-archiver",
        "--model-name", name,
        "--version", version,
        "--model-file", str(model_file),
        "--serialized-file", str(serialized_file),
        "--handler", str(handler),
        "--extra-files", ",".join(str(p) for p in extra_files),
        "--config-file", str(config_file),
        "--export-path", str(export_path),
        "--force",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env({}))
    mar = export_path / f"{name}.mar"
    if proc.returncode != 0 or not mar.is_file():
        raise RuntimeError(
            f"torch-model-archiver failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        )
    return mar


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------ HTTP
@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    elapsed_s: float = 0.0

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    def __str__(self) -> str:
        body = self.body[:500].decode("utf-8", errors="replace")
        return f"HTTP {self.status} {self.reason} {dict(self.headers)} {body!r}"


def multipart(fields: Mapping[str, tuple[str, bytes, str]]) -> tuple[bytes, str]:
    """``{name: (filename, bytes, content type)}`` as curl -F sends it: (body, Content-Type)."""
    boundary = "------------------------" + uuid.uuid4().hex[:24]
    out = bytearray()
    for name, (filename, data, content_type) in fields.items():
        out += f"--{boundary}\r\n".encode()
        out += f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'.encode()
        out += f"Content-Type: {content_type}\r\n\r\n".encode()
        out += data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30,
) -> Response:
    """One request to 127.0.0.1:``port`` on a fresh connection."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, resp.reason, list(resp.getheaders()), data, time.perf_counter() - start)
    finally:
        conn.close()


# ------------------------------------------------------------------------------------ server
class ServerError(RuntimeError):
    pass


@dataclass
class TorchServe:
    """One TorchServe process tree rooted at ``root``; ``start()``, then always ``stop()``."""

    root: Path
    models: dict[str, str]  # name -> .mar file name in the model store
    model_store: Path
    properties: dict[str, str] = field(default_factory=dict)
    inference_port: int = 0
    management_port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen | None = None
    started_s: float = 0.0
    _tmp: Path | None = None
    _own_tmp: bool = False
    stop_output: str = ""

    # -- paths ----------------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def config_path(self) -> Path:
        return self.root / "config.properties"

    def _tmp_dir(self) -> Path:
        """The JVM's and the launcher's temp dir; short, as it holds the workers' unix sockets."""
        candidate = self.root / "tmp"
        if len(str(candidate)) <= 70:
            candidate.mkdir(parents=True, exist_ok=True)
            return candidate
        self._own_tmp = True
        return Path(tempfile.mkdtemp(prefix="hkts-", dir="/tmp" if os.path.isdir("/tmp") else None))

    def env(self) -> dict[str, str]:
        assert self._tmp is not None
        return _env(
            {
                "TMPDIR": str(self._tmp),  # the launcher's pid file: .model_server.pid
                "TEMP": str(self._tmp),  # -Djava.io.tmpdir: unpacked models, worker sockets
                "LOG_LOCATION": str(self.logs),
                "METRICS_LOCATION": str(self.logs),
            }
        )

    # -- lifecycle ------------------------------------------------------------------------
    def write_config(self) -> dict[str, str]:
        self.inference_port, self.management_port, self.metrics_port, grpc_inf, grpc_mgmt = free_ports(5)
        props = {
            "inference_address": f"http://{HOST}:{self.inference_port}",
            "management_address": f"http://{HOST}:{self.management_port}",
            "metrics_address": f"http://{HOST}:{self.metrics_port}",
            "grpc_inference_address": HOST,
            "grpc_management_address": HOST,
            "grpc_inference_port": str(grpc_inf),
            "grpc_management_port": str(grpc_mgmt),
            # Worker ports; used only when the frontend falls back to TCP (no native epoll).
            "initial_worker_port": str(free_port_range(8)),
            "number_of_gpu": "0",  # CPU workers, like MockContext.from_model_dir (gpu_id None)
            "default_workers_per_model": "1",
            "install_py_dep_per_model": "false",
            "disable_system_metrics": "true",  # no psutil collector every minute
            "enable_envvars_config": "false",
            "default_response_timeout": "120",
            "number_of_netty_threads": "2",
            "netty_client_threads": "2",
            "model_store": str(self.model_store),
        }
        props.update(self.properties)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return props

    def command(self) -> list[str]:
        return [
            tool("torchserve") or "torchserve",
            "--start",
            "--foreground",
            "--ncs",
            "--disable-token-auth",
            "--ts-config", str(self.config_path),
            "--model-store", str(self.model_store),
            "--models", *[f"{name}={mar}" for name, mar in self.models.items()],
        ]  # fmt: skip

    def start(self, timeout: float = 120) -> None:
        """Launch, then wait until /ping is Healthy and every model has a READY worker."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._tmp = self._tmp_dir()
        self.write_config()
        start = time.monotonic()
        with open(self.logs / "launcher.log", "wb") as out:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.root,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # launcher, JVM and workers share one process group
            )
        _LIVE.add(self.process.pid)
        self.wait_ready(start + timeout)
        self.started_s = time.monotonic() - start

    def wait_ready(self, deadline: float) -> None:
        last = "no answer yet"
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(f"torchserve exited with {self.process.returncode} before it was ready\n{self.diagnostics()}")
            try:
                ping = request(self.inference_port, "GET", "/ping", timeout=5)
                last = f"/ping: {ping}"
                if ping.status == 200 and ping.json().get("status") == "Healthy":
                    states = {name: self.worker_states(name) for name in self.models}
                    last = f"workers: {states}"
                    if all(s and all(st == "READY" for st in s) for s in states.values()):
                        return
            except (OSError, http.client.HTTPException, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ServerError(f"TorchServe not ready in time; last: {last}\n{self.diagnostics()}")
            time.sleep(0.5)

    def worker_states(self, name: str) -> list[str]:
        resp = request(self.management_port, "GET", f"/models/{name}", timeout=5)
        if resp.status != 200:
            return []
        return [w.get("status", "?") for w in resp.json()[0].get("workers", [])]

    def stop(self, timeout: float = 30) -> list[str]:
        """``torchserve --stop``, then SIGTERM/SIGKILL whatever is left of the process group.

        Returns notes on what had to be forced (empty when the clean stop sufficed).
        """
        notes: list[str] = []
        proc = self.process
        if proc is None:
            return notes
        if proc.poll() is None:
            try:
                stopped = subprocess.run(
                    [tool("torchserve") or "torchserve", "--stop"],
                    cwd=self.root,
                    env=self.env(),
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
                self.stop_output = (stopped.stdout + stopped.stderr).strip()
            except (OSError, subprocess.SubprocessError) as exc:
                notes.append(f"torchserve --stop failed: {exc}")
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                notes.append("launcher still running after torchserve --stop")
        # The workers (and a JVM that ignored SIGTERM) may outlive the launcher.
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not _group_alive(proc.pid):
                break
            notes.append(f"process group {proc.pid} still alive: {sig.name}")
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + grace
            while _group_alive(proc.pid) and time.monotonic() < end:
                time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        _LIVE.discard(proc.pid)
        if self._own_tmp and self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        return notes

    # -- diagnostics ----------------------------------------------------------------------
    def diagnostics(self, lines: int = 40) -> str:
        parts = [f"server root: {self.root}", f"command: {' '.join(self.command())}"]
        # ts_log.log and the launcher's console repeat the worker's MODEL_LOG lines.
        for name, n, skip in (
            ("model_log.log", lines, NOISE),
            ("ts_log.log", lines, (*NOISE, "MODEL_LOG")),
            ("launcher.log", 10, (*NOISE, "MODEL_LOG")),
        ):
            parts.append(f"----- tail of {self.logs / name} -----\n{tail(self.logs / name, n, skip=skip)}")
        return "\n".join(parts)

    # -- requests -------------------------------------------------------------------------
    def predict(
        self,
        model: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
        timeout: float = 30,
    ) -> Response:
        return request(self.inference_port, method, f"/predictions/{model}", body, headers, timeout)

    def management(self, method: str, path: str, timeout: float = 10) -> Response:
        return request(self.management_port, method, path, timeout=timeout)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader still counts; ask /proc for live members (Linux), else trust killpg.
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        # fields[0] is the state, fields[2] the process group
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


#: Process groups of servers started and not yet stopped; killed if the interpreter exits first.
_LIVE: set[int] = set()


@atexit.register
def _kill_leftovers() -> None:
    for pgid in list(_LIVE):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@contextlib.contextmanager
def serving(root: Path, archives: Mapping[str, Path], timeout: float) -> Iterator[TorchServe]:
    """A started TorchServe serving ``archives`` (name -> archive, all in one store), stopped at
    the end whatever happened; a server that does not start fails the test with its logs."""
    import pytest

    store = next(iter(archives.values())).parent
    models = {name: path.name for name, path in archives.items()}
    for attempt in (1, 2):
        ts = TorchServe(root=root if attempt == 1 else root / "second_start", models=models, model_store=store)
        try:
            ts.start(timeout=timeout)
            break
        except ServerError as exc:
            ts.stop()
            # TorchServe 0.12's async worker (asyncCommunication) now and then disconnects right
            # after its first load and its retry never loads: the server is started once more
            # (a fresh one); the answers are checked as strictly either way.
            if attempt == 2 or "not ready in time" not in str(exc):
                pytest.fail(str(exc), pytrace=False)
            sys.stderr.write(f"\nTorchServe not ready in {timeout} s ({root}); starting a fresh one once more\n")
        except BaseException:
            ts.stop()
            raise
    sys.stderr.write(f"\nTorchServe ready in {ts.started_s:.1f} s ({ts.root})\n")
    try:
        yield ts
    finally:
        forced = ts.stop()
        if forced:
            warnings.warn(f"TorchServe did not stop cleanly: {forced}", stacklevel=1)

