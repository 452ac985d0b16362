"""The KServe server's process (``handlerkit.serving.kserve._server``) without kserve serving
anything: a stand-in child shows how the server is stopped, named and told when it fails.
The live server is tests/serving/kserve/test_kserve.py's and test_model_batching.py's."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from handlerkit.errors import HandlerkitError
from handlerkit.serving.kserve._server import KServeServer, _wait_ready


def child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_stop_ends_a_running_server_and_says_so(tmp_path):
    server = KServeServer(child("import time; time.sleep(60)"), 8123, "prices", tmp_path / "server.log")
    assert server.v2_url == "http://127.0.0.1:8123/v2/models/prices"
    assert repr(server) == "<KServeServer prices at http://127.0.0.1:8123 (running)>"
    with server:
        pass  # leaving the block stops it
    assert server.process.returncode is not None and repr(server).endswith(f"(exited {server.process.returncode})>")
    server.stop()  # a second stop is harmless


def test_a_server_that_exits_before_it_is_ready_is_told_with_its_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("loading prices\nTraceback (most recent call last):\nValueError: no weights\n")
    server = KServeServer(child("import sys; sys.exit(3)"), 8124, "prices", log)
    server.process.wait(timeout=30)
    with pytest.raises(HandlerkitError, match=r"^the KServe server exited with 3; last: no answer yet\n") as info:
        _wait_ready(server, time.monotonic() + 30)
    assert info.value.message.endswith("ValueError: no weights")
    assert info.value.fix == "read the log above: the handler's own error is there"


def test_a_server_never_ready_is_told_at_the_deadline(tmp_path):
    server = KServeServer(child("import time; time.sleep(60)"), 9, "prices", tmp_path / "missing.log")
    try:
        with pytest.raises(HandlerkitError, match=r"was not ready in time; last: ConnectionRefusedError") as info:
            _wait_ready(server, time.monotonic())  # port 9 refuses at once; the deadline has passed
        assert info.value.message.endswith("(no log)")
    finally:
        server.stop()
