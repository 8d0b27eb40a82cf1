"""The S3 byte counter of benchmarks/bench_ray_export.py charges bytes to the window they
moved in: a keep-alive connection that carried the dataset's upload and closes during an
export must not charge the upload to that export (it did: local executor 1.87 GB up for a
0.78 GB dataset, against Ray's 1.05 GB, the upload counted twice)."""

from __future__ import annotations

import importlib
import socket
import socketserver
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from helpers import serving

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[str]:
    """A TCP server on loopback that sends back what it receives, until the client closes."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    yield from serving(server)


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # its `from _report import ...`
    return importlib.import_module("bench_ray_export")


def _exchange(sock: socket.socket, size: int) -> None:
    sock.sendall(b"x" * size)
    got = 0
    while got < size:
        got += len(sock.recv(1 << 16))


def test_bytes_of_a_connection_are_charged_to_the_window_they_moved_in(
    bench: ModuleType, echo_server: str
) -> None:
    relay = bench.Relay(echo_server)
    try:
        _windows(relay)
    finally:
        relay.close()


def _windows(relay: Any) -> None:
    before = socket.create_connection(("127.0.0.1", relay.port))
    _exchange(before, 1_000_000)  # the upload, on a connection kept alive past it
    relay.reset()  # an export starts
    _exchange(before, 1_000)  # the old connection moves a little during it ...
    with socket.create_connection(("127.0.0.1", relay.port)) as during:
        _exchange(during, 20_000)  # ... and the export's own connection more
    before.close()  # the upload's connection closes during the export
    relay.settle(timeout=10.0)
    assert relay.everyone == {"up": 21_000, "down": 21_000, "connections": 1}
