"""Is a TCP port free to serve on, and if not, what holds it (standard library only).

Ray Serve's HTTP proxy listens with ``SO_REUSEPORT``, so a second local Serve instance on a
port another one (or any server that set that option) listens on *shares* it: the kernel splits
new connections between the two listeners, and each answers 404 for the other's models. A plain
bind test before starting Ray refuses that instead: a socket without ``SO_REUSEPORT`` cannot bind
a port something listens on. ``SO_REUSEADDR`` is set so that a port whose last listener has just
closed (connections left in TIME_WAIT) counts as free, as it is for the proxy.

Who holds the port is read from ``/proc`` on Linux (the listening socket's inode in
``/proc/net/tcp`` and ``tcp6``, then the process whose file descriptors include it); elsewhere,
or for another user's process, it stays unnamed.
"""

from __future__ import annotations

import errno
import os
import socket

__all__ = ["listener_of", "port_holder"]

_LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp
_COMMAND_CHARS = 80


def port_holder(host: str, port: int) -> str | None:
    """None when ``host:port`` is free to listen on; else what holds it, e.g. ``"pid 1234
    (python -m http.server 8080)"`` or ``"another process"``. Errors other than "address in
    use" (no such local address, a privileged port) are left for the server to report."""
    if port == 0:  # any free port
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None
            return listener_of(port) or "another process"
    return None


def listener_of(port: int) -> str | None:
    """``"pid N (command line)"`` of the process listening on TCP ``port``, from ``/proc``; None
    where that cannot be read (not Linux, another user's process)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return f"pid {pid} ({_command(pid)})"
    return None


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on ``port`` (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(fields[9])
    return inodes


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return "command unknown"
    text = " ".join(w.decode("utf-8", "replace") for w in words) or "command unknown"
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 1] + "…"
