"""Object-store I/O run by a helper process, so that the calling process stays fork-safe.

obstore's I/O runtime does not survive ``os.fork()``: once a process has made one request,
every process forked from it hangs on its first request. PyTorch DataLoader workers are
forked by default. So the process that opens an object store does not make requests
itself: it hands them to one helper process (started with ``spawn``, shared by every store
of the process, stopped at exit). Processes forked or spawned later (DataLoader workers,
export workers) make their requests directly, at full speed.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing
import threading
from multiprocessing.connection import Connection
from typing import Any

from shardex.errors import StorageError

_client: _Client | None = None
_client_lock = threading.Lock()


def call(uri: str, options: dict[str, Any], op: str, *args: Any) -> Any:
    """Run ``ObjectStorage(uri, options).<op>(*args)`` in the helper process."""
    global _client
    with _client_lock:
        if _client is None or not _client.alive:
            _client = _Client()
    return _client.call(uri, options, op, args)


class _Client:
    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child,), daemon=True, name="shardex-object-io"
        )
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        atexit.register(self.close)

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def call(self, uri: str, options: dict[str, Any], op: str, args: tuple[Any, ...]) -> Any:
        with self._lock:
            try:
                self._conn.send((uri, options, op, args))
                status, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise StorageError(f"the object-storage helper process stopped ({exc})") from exc
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()
        self._proc.join(timeout=2)
        if self._proc.is_alive():
            self._proc.kill()


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the helper process
    from shardex.storage.object import ObjectStorage

    stores: dict[tuple[str, str], ObjectStorage] = {}
    writers: dict[int, Any] = {}
    streams: dict[int, Any] = {}
    ids = itertools.count()
    while True:
        try:
            uri, options, op, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            name = (uri, repr(sorted(options.items())))
            store = stores.get(name)
            if store is None:
                store = stores[name] = ObjectStorage(uri, options, delegate=False)
            if op == "open_writer":
                wid = next(ids)
                writers[wid] = store.open_writer(*args)
                result: Any = wid
            elif op == "open_stream":
                sid = next(ids)
                streams[sid] = store.iter_chunks(*args)
                result = sid
            elif op == "next_chunk":
                result = next(streams[args[0]], None)
                if result is None:
                    streams.pop(args[0], None)
            elif op in ("write", "commit", "abort"):
                wid, *rest = args
                result = getattr(writers[wid], op)(*rest)
                if op != "write":
                    writers.pop(wid, None)
            else:
                result = getattr(store, op)(*args)
                if op == "list":
                    result = list(result)
            conn.send(("ok", result))
        except BaseException as exc:  # sent back and raised in the caller
            try:
                conn.send(("error", exc))
            except Exception:
                conn.send(("error", StorageError(f"{type(exc).__name__}: {exc}")))
