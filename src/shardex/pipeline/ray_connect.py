"""Joining a Ray cluster for an export, and leaving it again.

``ray.init`` retries a dead address for minutes, so shardex probes it first: Ray speaks
gRPC (HTTP/2), whose server must answer a client preface with SETTINGS (RFC 9113, 3.4).
With ``RAY_USE_TLS`` only the TCP connection is checked.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
from typing import Any, Final

from shardex.errors import ClusterUnreachableError, ConfigError

TIMEOUT_ENV: Final = "SHARDEX_RAY_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT: Final = 10.0
#: Ports Ray listens on when an address names none: the GCS, and the Ray Client server.
_GCS_PORT: Final = 6379
_CLIENT_PORT: Final = 10001


def connect_timeout() -> float:
    """Seconds to wait for a cluster's address to answer (``SHARDEX_RAY_CONNECT_TIMEOUT``)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        raise ConfigError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ConfigError(f"{TIMEOUT_ENV}={text!r} must be a positive number of seconds")
    return value


def host_port(address: str) -> tuple[str, int] | None:
    """The TCP endpoint of a Ray address; None for what Ray resolves (``auto``, ``local``)."""
    if address in ("auto", "local"):
        return None
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    try:
        parts = urllib.parse.urlsplit(f"//{rest}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or parts.path or "://" in rest:
        raise ConfigError(
            f"Ray address {address!r} is not host:port or ray://host:port "
            "(or 'auto': the cluster `ray start` runs on this machine)"
        )
    return host, port or (_CLIENT_PORT if client else _GCS_PORT)


#: The HTTP/2 connection preface, then an empty SETTINGS frame.
_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_FRAME_HEADER: Final = 9
_SETTINGS: Final = 4


def check_reachable(address: str | None) -> None:
    """Raise ClusterUnreachableError when Ray does not answer at ``address`` in time."""
    endpoint = None if address is None else host_port(address)
    if endpoint is None:
        return
    reason = _probe(endpoint, connect_timeout())
    if reason is None:
        return
    raise ClusterUnreachableError(
        f"cannot reach the Ray cluster at {address!r} ({reason}); check the address "
        "(--ray-address, ray_address=), start the cluster (`ray start --head`), or give it "
        f"more time with {TIMEOUT_ENV}=SECONDS (default {DEFAULT_TIMEOUT:g})"
    )


def _probe(endpoint: tuple[str, int], timeout: float) -> str | None:
    """Why Ray does not answer at ``endpoint`` in time; None if it does."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(endpoint, timeout=timeout) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return None  # a TLS handshake comes first: not ours to make
            conn.sendall(_PREFACE)
            head = b""
            while len(head) < _FRAME_HEADER:
                conn.settimeout(max(deadline - time.monotonic(), 1e-3))
                piece = conn.recv(_FRAME_HEADER - len(head))
                if not piece:
                    break
                head += piece
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    if len(head) < _FRAME_HEADER:
        return "something accepts connections there but closed this one without answering: not Ray"
    if head[3] != _SETTINGS:
        return f"something answers there, but not as Ray does (gRPC); it began {head[:8]!r}"
    return None


def init(ray: Any, address: str | None, options: dict[str, Any]) -> bool:
    """Join (or start) the cluster unless already joined; whether it called ``ray.init``."""
    if ray.is_initialized():
        return False
    check_reachable(address)
    try:
        ray.init(address=address, **options)
    except ConnectionError as exc:  # Ray gave up: one line, not its traceback
        raise ClusterUnreachableError(
            f"cannot join the Ray cluster at {address!r}: {' '.join(str(exc).split())}"
        ) from exc
    return True
