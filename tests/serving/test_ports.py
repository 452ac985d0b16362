"""handlerkit.serving._ports: is a port free to serve on, and what holds it (no Ray here)."""

from __future__ import annotations

import os
import socket

from handlerkit.serving._ports import listener_of, port_holder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_port_holder_is_none_for_a_free_port_and_names_the_listening_process() -> None:
    port = _free_port()
    assert port_holder("127.0.0.1", port) is None and listener_of(port) is None
    assert port_holder("127.0.0.1", 0) is None  # any free port
    with open("/proc/self/cmdline", "rb") as f:
        command = " ".join(w.decode() for w in f.read().rstrip(b"\0").split(b"\0"))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        holder = f"pid {os.getpid()} ({command if len(command) <= 80 else command[:79] + '…'})"
        assert listener_of(port) == holder
        assert port_holder("127.0.0.1", port) == holder
        assert port_holder("0.0.0.0", port) == holder  # every address includes loopback's
    assert port_holder("127.0.0.1", port) is None  # closed: free again
