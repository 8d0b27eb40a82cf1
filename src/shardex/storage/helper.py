"""Object-store requests made by a helper process, for processes that cannot make them.

A process forked from one whose obstore runtime has started cannot use obstore (it would
hang, see :mod:`shardex.storage.direct`). Such a process, typically a forked DataLoader
worker, starts one helper of its own on its first request and sends it every request.

The helper is a fresh interpreter (``subprocess``, not ``multiprocessing``) whose main
module is shardex's, so it never runs the user's ``__main__`` (a script without an
``if __name__ == "__main__":`` guard, ``python -c``, stdin, a notebook: all work). It
exits when its owner closes or loses the pipe on the helper's stdin, SIGKILL included.
Each calling thread has its own connection, served by its own thread there.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import concurrent.futures
import contextlib
import functools
import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from shardex.errors import StorageError
from shardex.per_process import PerProcess
from shardex.storage.base import CountingWriter, ObjectWriter, Storage
from shardex.storage.direct import DirectObjectStorage as _Direct

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

#: The helper's whole main module: find this shardex, then serve.
_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); from shardex.storage.helper import serve; serve()"
)

#: Threads that send batches started early (each has its own connection to the helper).
_senders: PerProcess[concurrent.futures.ThreadPoolExecutor] = PerProcess(
    lambda: concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="shardex-helper-io")
)
_client: _Client | None = None
_client_lock = threading.Lock()


def _forget_in_child() -> None:
    """In a forked child: drop the parent's helper, closing the child's copies of its pipes
    and of this thread's connection. The helper exits when its stdin has no writer left;
    a child keeping a copy of that pipe kept it alive after the parent ended (os._exit,
    as multiprocessing workers end, or a kill) for as long as the child lived."""
    global _client, _client_lock
    _client_lock = threading.Lock()  # another thread of the parent may have held it
    client, _client = _client, None
    if client is not None:
        client.forget()


os.register_at_fork(after_in_child=_forget_in_child)


def _helper() -> _Client:
    """This process's helper, started on first use (and again in a forked child)."""
    global _client
    with _client_lock:
        if _client is None or _client.pid != os.getpid() or not _client.alive:
            _client = _Client()
        return _client


class _Client:
    """The helper process and this process's per-thread connections to it."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.pid = os.getpid()
        self._key = os.urandom(16)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT.format(root=root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write(self._key.hex().encode() + b"\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline().decode().strip()
        if not line:
            self._proc.wait()
            raise StorageError(
                f"the object-storage helper process ({sys.executable}) did not start "
                f"(exit status {self._proc.returncode}); its errors are above"
            )
        self._address: str = ast.literal_eval(line)
        self._local = threading.local()
        atexit.register(self.close)

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def call(self, message: tuple[Any, ...]) -> Any:
        conn: Connection | None = getattr(self._local, "conn", None)
        try:
            if conn is None:
                from multiprocessing.connection import Client

                conn = self._local.conn = Client(self._address, authkey=self._key)
            conn.send(message)
            status, value = conn.recv()
        except (EOFError, OSError) as exc:
            raise StorageError(f"the object-storage helper process stopped ({exc})") from exc
        if status == "error":
            raise value
        return value

    def forget(self) -> None:
        """Close this process's copies of the pipes and connection (a forked child's:
        the parent flushed its only write, so closing writes nothing)."""
        conn: Connection | None = getattr(self._local, "conn", None)
        for pipe in (self._proc.stdin, self._proc.stdout, conn):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def close(self) -> None:
        if os.getpid() != self.pid:  # a forked child inherited this at-exit call
            return
        with contextlib.suppress(OSError):
            self._proc.stdin.close()  # type: ignore[union-attr]  # the helper exits on EOF
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class _Remote:
    """An operation of :class:`HelperObjectStorage`: the helper runs
    :class:`~shardex.storage.direct.DirectObjectStorage`'s operation of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._op = getattr(_Direct, name)

    def __get__(self, storage: HelperObjectStorage | None, owner: type | None = None) -> Any:
        return self if storage is None else functools.partial(storage._run, self._op)

    def __call__(self, storage: HelperObjectStorage, *args: Any) -> Any:
        """Called on the class, as a plain method is."""
        return storage._run(self._op, *args)


class HelperObjectStorage(Storage):
    """The same storage as ``DirectObjectStorage(uri, options)``, run by the helper."""

    def __init__(self, uri: str, options: dict[str, Any]) -> None:
        self.uri = uri
        self._options = options

    def __repr__(self) -> str:  # no options: they may hold credentials
        return f"HelperObjectStorage({self.uri!r})"

    def _run(self, op: Callable[..., Any], *args: Any, keep: bool = False) -> Any:
        return _helper().call((self.uri, self._options, op, args, keep))

    # run there as DirectObjectStorage runs them
    get = _Remote()
    get_range = _Remote()
    get_head = _Remote()
    size = _Remote()
    exists = _Remote()
    delete = _Remote()
    rename = _Remote()
    get_tagged = _Remote()
    list_folder = _Remote()
    presign = _Remote()

    def get_ranges(self, path: str, starts: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        return self.get_range_batch([(path, s, n) for s, n in zip(starts, lengths, strict=True)])

    def get_range_batch(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        return self._run(_Direct.get_range_batch, list(requests))  # type: ignore[no-any-return]

    def submit_range_batch(
        self, requests: Sequence[tuple[str, int, int]]
    ) -> concurrent.futures.Future[list[bytes]]:
        """Sent by a thread of this process, on its own connection to the helper."""
        return _senders().submit(self.get_range_batch, list(requests))

    def iter_chunks(self, path: str, chunk_size: int = 4 << 20) -> Iterator[bytes]:
        stream = self._run(_Direct.stream_chunks, path, chunk_size, keep=True)
        finished = False
        try:
            while (chunk := _helper().call((None, None, _next, (stream,), False))) is not None:
                yield chunk
            finished = True
        finally:
            if not finished:  # stopped early: let the helper drop the response
                _helper().call((None, None, _close, (stream,), False))

    def list(self, prefix: str = "") -> Iterator[str]:
        return iter(self._run(_list, prefix))

    def list_pages(
        self, folder: str = "", after: str | None = None
    ) -> Iterator[builtins.list[tuple[str, int]]]:
        yield self._run(_list_all, folder, after)  # one page: the helper lists every page

    def put(self, path: str, data: bytes | bytearray | memoryview) -> None:
        self._run(_Direct.put, path, bytes(data))

    def put_if(self, path: str, data: bytes, tag: str | None) -> str | None:
        return self._run(_Direct.put_if, path, bytes(data), tag)  # type: ignore[no-any-return]

    def open_writer(self, path: str) -> ObjectWriter:
        return _HelperWriter(self._run(_Direct.open_writer, path, keep=True))


def _list(storage: Storage, prefix: str) -> list[str]:
    return list(storage.list(prefix))


def _list_all(storage: Storage, folder: str, after: str | None) -> list[tuple[str, int]]:
    return [entry for page in storage.list_pages(folder, after) for entry in page]


def _next(stream: Iterator[bytes]) -> bytes | None:
    return next(stream, None)


def _close(stream: Iterator[bytes]) -> None:
    stream.close()  # type: ignore[attr-defined]  # a generator: drops the HTTP response


def _write(writer: ObjectWriter, data: bytes) -> None:
    writer.write(data)


def _commit(writer: ObjectWriter) -> None:
    writer.commit()


def _abort(writer: ObjectWriter) -> None:
    writer.abort()


class _HelperWriter(CountingWriter):
    """A multipart write made by the helper process on behalf of this one."""

    def __init__(self, handle: int) -> None:
        super().__init__()
        self._handle = handle

    def _run(self, op: Callable[..., Any], *args: Any) -> None:
        _helper().call((None, None, op, (self._handle, *args), False))

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._run(_write, bytes(data))
        self._pos += len(data)

    def commit(self) -> None:
        if not self._done:
            self._done = True
            self._run(_commit)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._run(_abort)


class _State:
    """What the helper keeps between requests: stores, open writers and streams."""

    def __init__(self) -> None:
        self.stores: dict[tuple[str, str], Storage] = {}
        self.handles: dict[int, Any] = {}  # writer and stream ids -> objects
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def store(self, uri: str, options: dict[str, Any]) -> Storage:
        name = (uri, repr(sorted(options.items())))
        with self.lock:
            if name not in self.stores:
                self.stores[name] = _Direct(uri, options)
            return self.stores[name]

    def run(
        self,
        uri: str | None,
        options: Any,
        op: Callable[..., Any],
        args: tuple[Any, ...],
        keep: bool,
    ) -> Any:
        if uri is None:  # an operation on a kept writer or stream
            handle_id, *rest = args
            result = op(self.handles[handle_id], *rest)
            if op in (_commit, _abort, _close) or (op is _next and result is None):
                self.handles.pop(handle_id, None)
            return result
        result = op(self.store(uri, options), *args)
        if not keep:
            return result
        with self.lock:
            handle_id = next(self.ids)
            self.handles[handle_id] = result
        return handle_id


def serve() -> None:  # pragma: no cover - runs in the helper
    """The helper's main: read the key, listen, serve until stdin closes."""
    from multiprocessing.connection import Listener

    key = bytes.fromhex(sys.stdin.buffer.readline().decode().strip())
    state = _State()
    # An abstract socket on Linux: no file to clean up, as the helper ends by os._exit
    address = f"\0shardex-helper-{os.urandom(8).hex()}" if sys.platform == "linux" else None
    listener = Listener(address, family="AF_UNIX", authkey=key)
    sys.stdout.write(f"{listener.address!r}\n")
    sys.stdout.flush()

    def watch() -> None:  # the owner is gone (or closed us): exit
        with contextlib.suppress(OSError):
            sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    while True:
        conn = listener.accept()
        threading.Thread(target=_serve_connection, args=(conn, state), daemon=True).start()


def _serve_connection(conn: Connection, state: _State) -> None:  # pragma: no cover
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", state.run(*message)))
        except BaseException as exc:  # sent back and raised in the caller
            try:
                conn.send(("error", exc))
            except Exception:
                conn.send(("error", StorageError(f"{type(exc).__name__}: {exc}")))
