"""free_port: ports below the ephemeral range, each once, never one a socket holds."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from localtriton import ports


def test_ports_lie_below_the_ephemeral_range_and_are_never_given_twice() -> None:
    low, high = ports.ephemeral_range()
    assert ports.LOWEST_PORT < low <= high
    given = [ports.free_port() for _ in range(300)]
    assert len(set(given)) == len(given)
    assert all(ports.LOWEST_PORT <= port < low for port in given)


def test_a_port_is_free_to_listen_on() -> None:
    port = ports.free_port()
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as server:
        server.bind(("127.0.0.1", port))
        server.listen()


def test_a_port_held_by_a_socket_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        low, _ = ports.ephemeral_range()
        spare = next(port for port in range(low - 1, ports.LOWEST_PORT, -1) if port not in ports._handed_out)
        choices: Iterator[int] = iter([taken, spare])
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (65000, 65535))  # so `taken` is a candidate
        monkeypatch.setattr(ports.random, "randrange", lambda start, stop: next(choices))
        assert ports.free_port() == spare


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("10500\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", setting)
    assert ports.ephemeral_range() == (10500, 60999)
    assert ports.free_port() >= 10500


def test_an_unreadable_range_falls_back_to_linux_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_range() == ports.LINUX_EPHEMERAL_RANGE
