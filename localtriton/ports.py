"""Free TCP ports for local servers (tests, benchmarks), chosen where client sockets never land."""

from __future__ import annotations

import random
import socket
from contextlib import closing
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32768, 60999)
LOWEST_PORT = 10_000  # below: well-known and registered services a developer may run
ATTEMPTS = 200

_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (and for bind to port 0)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing on `host` is bound to now, below the ephemeral range, not handed out before here.

    A port from bind(0) lies in the ephemeral range, where outgoing connections take their local ports
    too: between this call and the server's own bind, a client socket can take it and the server exits
    with 'address already in use'. Below that range only servers bind, and each port is given once per
    process, so two servers started together never get the same one.
    """
    low, _ = ephemeral_range()
    if low - LOWEST_PORT < 1000:  # an unusual kernel setting: no room below, fall back to the kernel's choice
        return _bound_port(host, 0)
    for _ in range(ATTEMPTS):
        port = random.randrange(LOWEST_PORT, low)
        if port in _handed_out:
            continue
        try:
            _bound_port(host, port)
        except OSError:
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {host} between {LOWEST_PORT} and {low} after {ATTEMPTS} tries")


def _bound_port(host: str, port: int) -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, port))
        return int(sock.getsockname()[1])
