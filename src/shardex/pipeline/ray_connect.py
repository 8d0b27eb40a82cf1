"""Joining a Ray cluster for an export, and leaving it again.

``ray.init(address=...)`` with an address where no cluster answers retries for minutes,
printing its own log lines; shardex first opens a TCP connection to the address, within
``SHARDEX_RAY_CONNECT_TIMEOUT`` seconds (default 10), and refuses an address that does not
answer in one line (:class:`~shardex.errors.ClusterUnreachableError`). A Ray that shardex
started (``ray.init`` called because this process had none) is shut down when the export
ends; a Ray the caller had initialised is left as it was.
"""

from __future__ import annotations

import os
import socket
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


def check_reachable(address: str | None) -> None:
    """Raise ClusterUnreachableError, within the connect timeout, when nothing listens at
    ``address``."""
    endpoint = None if address is None else host_port(address)
    if endpoint is None:
        return
    timeout = connect_timeout()
    try:
        socket.create_connection(endpoint, timeout=timeout).close()
    except TimeoutError:
        reason = f"no answer within {timeout:g} s"
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
    else:
        return
    raise ClusterUnreachableError(
        f"cannot reach the Ray cluster at {address!r} ({reason}); check the address "
        "(--ray-address, ray_address=), start the cluster (`ray start --head`), or give it "
        f"more time with {TIMEOUT_ENV}=SECONDS (default {DEFAULT_TIMEOUT:g})"
    )


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
