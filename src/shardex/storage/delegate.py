"""Object-store I/O run by a helper process, so that the calling process stays fork-safe.

obstore's I/O runtime does not survive ``os.fork()``: once a process has made one request,
every process forked from it hangs on its first request. PyTorch DataLoader workers are
forked by default. So the process that opens an object store does not make requests
itself: it hands them to one helper process (started with ``spawn``, shared by every store
of the process, gone when the process exits). Each calling thread has its own connection
to the helper, served by its own thread there, so threads' requests run concurrently.
Processes forked or spawned later (DataLoader workers, export workers) make their requests
directly, at full speed.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing
import os
import threading
from multiprocessing.connection import Client, Connection, Listener
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
    """The helper process and this process's per-thread connections to it."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._key = os.urandom(16)
        self._lifeline, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, self._key), daemon=True, name="shardex-object-io"
        )
        self._proc.start()
        child.close()
        self._address = self._lifeline.recv()  # the helper's listening socket
        self._local = threading.local()
        self._pid = os.getpid()
        atexit.register(self.close)

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def _conn(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = Client(self._address, authkey=self._key)
        return conn

    def call(self, uri: str, options: dict[str, Any], op: str, args: tuple[Any, ...]) -> Any:
        try:
            conn = self._conn()
            conn.send((uri, options, op, args))
            status, value = conn.recv()
        except (EOFError, OSError) as exc:
            raise StorageError(f"the object-storage helper process stopped ({exc})") from exc
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        if os.getpid() != self._pid:  # a forked child inherited this at-exit call
            return
        with contextlib.suppress(OSError):
            self._lifeline.close()  # the helper exits when its lifeline closes
        self._proc.join(timeout=2)
        if self._proc.is_alive():
            self._proc.kill()


class _State:
    """What the helper keeps between requests: stores, open writers and streams."""

    def __init__(self) -> None:
        from shardex.storage.object import ObjectStorage

        self.make = ObjectStorage
        self.stores: dict[tuple[str, str], Any] = {}
        self.handles: dict[int, Any] = {}  # writer and stream ids -> objects
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def store(self, uri: str, options: dict[str, Any]) -> Any:
        name = (uri, repr(sorted(options.items())))
        with self.lock:
            if name not in self.stores:
                self.stores[name] = self.make(uri, options, delegate=False)
            return self.stores[name]

    def keep(self, handle: Any) -> int:
        with self.lock:
            handle_id = next(self.ids)
            self.handles[handle_id] = handle
        return handle_id

    def run(self, uri: str, options: dict[str, Any], op: str, args: tuple[Any, ...]) -> Any:
        if op == "open_writer":
            return self.keep(self.store(uri, options).open_writer(*args))
        if op == "open_stream":
            return self.keep(self.store(uri, options).iter_chunks(*args))
        if op == "next_chunk":
            chunk = next(self.handles[args[0]], None)
            if chunk is None:
                self.handles.pop(args[0], None)
            return chunk
        if op == "close_stream":
            stream = self.handles.pop(args[0], None)
            if stream is not None:
                stream.close()  # drops the HTTP response
            return None
        if op == "open_handles":  # for tests: writers and streams still open
            return len(self.handles)
        if op in ("write", "commit", "abort"):
            handle_id, *rest = args
            result = getattr(self.handles[handle_id], op)(*rest)
            if op != "write":
                self.handles.pop(handle_id, None)
            return result
        result = getattr(self.store(uri, options), op)(*args)
        return list(result) if op == "list" else result


def _serve(lifeline: Connection, key: bytes) -> None:  # pragma: no cover - in the helper
    state = _State()
    listener = Listener(family="AF_UNIX", authkey=key)
    lifeline.send(listener.address)

    def watch() -> None:  # the caller is gone (or closed us): exit
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    while True:
        conn = listener.accept()
        threading.Thread(target=_serve_connection, args=(conn, state), daemon=True).start()


def _serve_connection(conn: Connection, state: _State) -> None:  # pragma: no cover
    while True:
        try:
            uri, options, op, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", state.run(uri, options, op, args)))
        except BaseException as exc:  # sent back and raised in the caller
            try:
                conn.send(("error", exc))
            except Exception:
                conn.send(("error", StorageError(f"{type(exc).__name__}: {exc}")))
