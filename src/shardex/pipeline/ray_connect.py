"""Joining a Ray cluster for an export, and leaving it again.

``ray.init(address=...)`` with an address where no cluster answers retries for minutes,
printing its own log lines; shardex first checks the address, within
``SHARDEX_RAY_CONNECT_TIMEOUT`` seconds (default 10), and refuses one where Ray does not
answer in one line (:class:`~shardex.errors.ClusterUnreachableError`). Ray's GCS and its
Ray Client server both speak gRPC, which is HTTP/2: the check opens a TCP connection, sends
an HTTP/2 client preface and waits for the server's first frame, which HTTP/2 requires to be
SETTINGS (RFC 9113, section 3.4). A port that accepts and closes, an HTTP/1 server, or one
that never answers is not Ray. (With Ray's TLS on, ``RAY_USE_TLS``, the server expects a TLS
handshake first: only the TCP connection is checked.) A Ray that shardex
started (``ray.init`` called because this process had none) is shut down when the export
ends; a Ray the caller had initialised is left as it was.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
from typing import Any, Final

from shardex.errors import ClusterUnreachableError, ConfigError

#: The environment variable that bounds the check of a cluster's address (seconds).
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
    """The TCP endpoint of a Ray address (``host:port`` or ``ray://host:port``); None for
    what Ray resolves itself (``auto``, ``local``)."""
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


#: What a gRPC client sends first: the HTTP/2 connection preface, then an empty SETTINGS
#: frame (length 0, type 4, no flags, stream 0).
_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
#: An HTTP/2 frame header's length, and the type of a SETTINGS frame.
_FRAME_HEADER: Final = 9
_SETTINGS: Final = 4


def check_reachable(address: str | None) -> None:
    """Raise ClusterUnreachableError, within the connect timeout, when Ray does not
    answer at ``address`` (nothing listens, or something that is not Ray)."""
    endpoint = None if address is None else host_port(address)
    if endpoint is None:
        return
    timeout = connect_timeout()
    reason = _probe(endpoint, timeout)
    if reason is None:
        return
    raise ClusterUnreachableError(
        f"cannot reach the Ray cluster at {address!r} ({reason}); check the address "
        "(--ray-address, ray_address=), start the cluster (`ray start --head`), or give it "
        f"more time with {TIMEOUT_ENV}=SECONDS (default {DEFAULT_TIMEOUT:g})"
    )


def _probe(endpoint: tuple[str, int], timeout: float) -> str | None:
    """Why Ray does not answer at ``endpoint`` within ``timeout`` seconds; None if it does."""
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
    """Join (or start) the cluster unless this process already has; whether it called
    ``ray.init`` (so the caller shuts Ray down when done)."""
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
