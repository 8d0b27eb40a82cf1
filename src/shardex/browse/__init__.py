"""``shardex browse``: look at an export in the browser (a local, read-only web app).

Needs the ``browse`` extra; importing this package imports none of it. The page's assets
ship inside the package: nothing is fetched from the network.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Final, TextIO

from shardex.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    import socket

    from starlette.applications import Starlette

    from shardex.browse.app import Splits
    from shardex.storage import Storage

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8765
_INSTALL_HINT: Final = "pip install 'shardex[browse]'"


def open_browser(
    location: str | os.PathLike[str] | Storage,
    split: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> Splits:
    """Open an export for browsing: ``split`` now, the other splits when first asked for.

    Args:
        location: the export's folder or URL (``s3://...``), or a storage.
        split: the split shown first; default: the first in config.yaml.
    """
    _require()
    from shardex.api import read_config
    from shardex.browse.app import Splits
    from shardex.storage import open_storage

    storage = open_storage(location, storage_options)
    names = list(read_config(storage).splits)
    return Splits(storage, names, names[0] if split is None else split)


def create_app(
    location: str | os.PathLike[str] | Storage,
    split: str | None = None,
    *,
    host: str = DEFAULT_HOST,
    storage_options: dict[str, Any] | None = None,
) -> Starlette:
    """The ASGI app of :func:`browse`; requests naming another host are refused."""
    from shardex.browse.app import create_app as _create_app

    return _create_app(open_browser(location, split, storage_options=storage_options), host=host)


def browse(
    location: str | os.PathLike[str] | Storage,
    split: str | None = None,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    storage_options: dict[str, Any] | None = None,
    out: TextIO | None = None,
) -> None:
    """Serve an export, read-only, in the browser until interrupted (Ctrl-C).

    Args:
        location: the export's folder or URL, or a storage.
        split: the split shown first; default: the first in config.yaml.
        host: address to bind (another than loopback shows the export to whoever can reach it).
        port: port to bind; 0 picks a free one.
        out: where to print the URL (default: standard output).

    Raises:
        MissingDependencyError: the ``browse`` extra is not installed.
        ConfigError: the address cannot be bound (port taken?).
    """
    _require()
    import uvicorn

    app = create_app(location, split, host=host, storage_options=storage_options)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"serving {location} at http://{shown}:{bound}/ (read-only; Ctrl-C stops)",
        file=out or sys.stdout,
        flush=True,
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def _bind(host: str, port: int) -> socket.socket:
    import socket  # `import shardex` loads this package; only serving binds

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # listen before the URL is printed: an early client waits in the backlog, not refused
        sock.listen(128)
    except (OSError, OverflowError) as exc:
        sock.close()
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(
            f"cannot serve on {host!r} port {port}: {why} (choose another --port, or 0 for "
            "any free one)"
        ) from exc
    return sock


def _require() -> None:
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            f"shardex browse needs Starlette, uvicorn and Jinja2 ({exc.name} is missing): "
            f"{_INSTALL_HINT}"
        ) from exc
