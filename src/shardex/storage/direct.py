"""Object-store requests made by this process itself, through obstore.

One ranged GET per ``get_range``; writes stream as multipart uploads with a few parts in
memory and become visible only when completed, so an aborted write leaves nothing.

obstore's I/O runtime does not survive ``os.fork()``: a child forked from a process whose
runtime has run hangs on its first request, even with a new store (obstore 0.12.1). This
module records which process started the runtime (:func:`forked_after_io`);
:class:`shardex.storage.object.ObjectStorage` uses it to send such a child's requests to a
helper process instead (see :mod:`shardex.storage.helper`).
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any, Final

from shardex.errors import ConfigError, MissingDependencyError, ObjectNotFoundError, StorageError
from shardex.storage.base import (
    BatchedStorage,
    CountingWriter,
    ObjectWriter,
    checked_path,
)
from shardex.storage.failures import storage_error
from shardex.storage.options import (
    CLIENT_OPTIONS,
    DEFAULT_RETRY_TIMEOUT,
    OWN_OPTIONS,
    batch_policy,
    client_value,
    duration,
    retry_config,
    setting,
)
from shardex.storage.profiles import profile_options

#: Bytes per multipart part; with MAX_PARTS_IN_FLIGHT, a writer holds at most ~32 MiB.
PART_SIZE: Final = 8 * 1024 * 1024
MAX_PARTS_IN_FLIGHT: Final = 4
#: Objects per page of a listing: what one S3 LIST request returns at most.
_PAGE: Final = 1000
#: Bytes a chunk of a streamed GET holds at least (the caller's chunk size if smaller),
#: plus what else had arrived (up to ~0.8 MiB in all seen on SeaweedFS). Streaming 18 MB
#: shards in such chunks and copying each into ``bytes`` costs the CPU of one
#: ``get().bytes()`` per shard; with 4 MiB chunks it cost ~3 us more a sample of 19 KB
#: (copying a chunk that has left the CPU cache; RESULTS.md, bench_s3.py).
STREAM_PIECE: Final = 256 << 10
#: Paths a storage remembers as checked (the shards of a few splits; more are checked
#: on each read).
_CHECKED_PATHS: Final = 4096

# The pid of the process whose obstore runtime was started by shardex (None before any).
_runtime_pid: int | None = None
# Stores built in this process, by (pid, root, options), the most recently used last:
# see DirectObjectStorage._client.
_stores: OrderedDict[tuple[int, str, str], Any] = OrderedDict()
_stores_lock = threading.Lock()
#: Stores kept for reuse: each holds its idle connections (a socket each) and ~130 KB,
#: so a process reading many roots in turn must not keep one per root for ever.
_KEPT_STORES: Final = 8


def forked_after_io() -> bool:
    """Whether this process was forked from one whose obstore runtime had started, so
    that obstore would hang here."""
    return _runtime_pid is not None and _runtime_pid != os.getpid()


def runtime_started() -> bool:
    """Whether this process (or the one it was forked from) has started obstore's runtime:
    until it has, children it forks can request directly."""
    return _runtime_pid is not None


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as exc:
        raise MissingDependencyError(
            "object storage needs obstore: pip install 'shardex[s3]'"
        ) from exc
    return obstore


class DirectObjectStorage(BatchedStorage):
    """Objects under ``uri``, requested by this process through obstore.

    Args:
        uri: the root URL, without a trailing slash.
        options: checked and merged options (see :mod:`shardex.storage.options`).
    """

    def __init__(self, uri: str, options: dict[str, Any]) -> None:
        self.uri = uri
        self._options = options
        self._store: Any = None
        self._get_range: Any = None  # obstore.get_range, bound on the first ranged read
        # Paths already checked by checked_path: ds[i] reads a few shards many times, and
        # the check (a regex and a scan of the parts) is per call otherwise.
        self._checked: set[str] = set()

    def __repr__(self) -> str:  # no options: they may hold credentials
        return f"DirectObjectStorage({self.uri!r})"

    @property
    def retry_timeout(self) -> timedelta:
        value = self._options.get("retry_timeout")
        return DEFAULT_RETRY_TIMEOUT if value is None else duration(value, "retry_timeout")

    def _client(self) -> Any:
        global _runtime_pid
        if self._store is None:
            # one store per root and options in a process (the last few): building one reads the
            # system's CA certificates (~0.5 MB), and an export opens its source and
            # output several times (a Ray driver's fixed cost: 2.6 MB of reads)
            key = (os.getpid(), self.uri, repr(sorted(self._options.items())))
            with _stores_lock:
                store = _stores.get(key)
                if store is None:
                    store = _stores[key] = self._make_store()
                    while len(_stores) > _KEPT_STORES:  # storages using it keep their own
                        _stores.popitem(last=False)
                else:
                    _stores.move_to_end(key)
            self._store = store
            _runtime_pid = os.getpid()
        return self._store

    def _make_store(self) -> Any:
        from obstore.store import from_url

        options = {k: v for k, v in self._options.items() if v is not None}
        if options.get("profile"):
            options = profile_options(str(options.pop("profile")), options)
        provider = options.pop("_credential_provider", None)
        config: dict[str, Any] = {}
        client: dict[str, Any] = {"connect_timeout": "5s", "timeout": "60s"}
        for name, value in options.items():
            if name.lower() in CLIENT_OPTIONS:
                client[name.lower()] = client_value(name.lower(), value)
            elif name not in OWN_OPTIONS:
                config[setting(self.uri, name)] = value if isinstance(value, bool) else str(value)
        endpoint = str(config.get("endpoint", ""))
        if endpoint.startswith("http://") or self.uri.startswith("http://"):
            client.setdefault("allow_http", True)
        kwargs: dict[str, Any] = {
            "client_options": client,
            "retry_config": retry_config(self.retry_timeout),
        }
        if provider is not None:
            kwargs["credential_provider"] = provider
        try:
            return from_url(self.uri, config=config or None, **kwargs)  # type: ignore[arg-type]
        except Exception as exc:  # obstore rejects bad options with several types
            raise ConfigError(f"cannot use {self.uri}: {str(exc).splitlines()[0]}") from exc

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self._client(), *args, **kwargs)
        except StorageError:
            raise
        except Exception as exc:
            raise storage_error(exc, what, self._options) from exc

    def get(self, path: str) -> bytes:
        checked_path(path, self.uri)
        result = self._call(self.join(path), _obstore().get, path)
        return bytes(result.bytes())

    def get_range(self, path: str, start: int, length: int) -> bytes:
        # The path of every sample read (ds[i], one GET each): no per-call work but the
        # request, a path check per new path, and the copy into ``bytes``.
        if path not in self._checked:
            checked_path(path, self.uri)
            if len(self._checked) < _CHECKED_PATHS:
                self._checked.add(path)
        if length == 0:
            return b""
        get_range = self._get_range
        if get_range is None:
            get_range = self._get_range = _obstore().get_range
        store = self._store if self._store is not None else self._client()
        try:
            data = get_range(store, path, start=start, length=length)
        except Exception as exc:
            raise storage_error(exc, self.join(path), self._options) from exc
        return bytes(data)

    def get_head(self, path: str, length: int) -> tuple[bytes, int]:
        checked_path(path, self.uri)
        got = self._call(self.join(path), _obstore().get, path, options={"range": (0, length)})
        return bytes(got.bytes()), int(got.meta["size"])

    async def _batch(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Ranged GETs of several objects, concurrent and hedged (:mod:`.batch`; storage
        options ``read_concurrency`` and ``hedge``).

        Each range is its own request: obstore's ``get_ranges`` would merge ranges up to
        1 MiB apart into one GET, fetching far more than asked.
        """
        for path in {r[0] for r in requests}:
            checked_path(path, self.uri)
        from shardex.storage.batch import event_loop, fetch_all

        obstore, store, loop = _obstore(), self._client(), event_loop()

        async def fetch(path: str, start: int, length: int) -> bytes:
            got = obstore.get_range_async(store, path, start=start, length=length)
            return bytes(await loop.tracked(got))

        try:
            return await fetch_all(fetch, requests, batch_policy(self._options))
        except Exception as exc:
            where = f"{self.uri} (one of {len(requests)} ranged reads)"
            raise storage_error(exc, where, self._options) from exc

    def iter_chunks(self, path: str, chunk_size: int = 4 << 20) -> Iterator[bytes]:
        """The object as a stream: one GET, read as chunks arrive, each of at least
        ``min(chunk_size, STREAM_PIECE)`` bytes (but the last) and what else had arrived.
        Closing the iterator (or dropping it) ends the request.

        Each chunk is the ``bytes`` object obstore made for it (obstore 0.12 copies each
        chunk of a stream into a new ``bytes``): handed over as is, not copied again.

        No thread reads ahead: while the caller works on a chunk, the kernel's socket
        buffer takes in what follows (Linux grows it to 32 MiB), which the next chunk
        then copies out. A read-ahead thread measured slower on SeaweedFS (iteration
        0.74-0.88 of whole-shard GETs against 0.87-1.07 without, same runs): each chunk
        it handed over waited for the GIL held by the caller's parsing.
        """
        return self.stream_chunks(path, min(chunk_size, STREAM_PIECE))

    def iter_objects(
        self, paths: Sequence[str], chunk_size: int = 4 << 20
    ) -> Iterator[Iterator[bytes]]:
        """Each object's :meth:`iter_chunks`, in order, the next object's GET sent when
        the one before it is handed over: its first bytes (the server's time to first
        byte, ~6 ms of a 19 MB object's ~29 on SeaweedFS here) come in while the caller
        works on the object before, in the kernel's socket buffer, not in this process.
        One request an object, as many as :meth:`iter_chunks` makes; stopping early
        ends the next object's request too (it was sent, so it counts)."""
        for path in paths:
            checked_path(path, self.uri)
        piece = min(chunk_size, STREAM_PIECE)
        from shardex.storage.batch import event_loop

        obstore, store, loop = _obstore(), self._client(), event_loop()

        async def get(path: str) -> Any:
            return await loop.tracked(obstore.get_async(store, path))

        ahead: concurrent.futures.Future[Any] | None = None
        try:
            for k, path in enumerate(paths):
                sent = ahead if ahead is not None else loop.submit(get(path))
                ahead = loop.submit(get(paths[k + 1])) if k + 1 < len(paths) else None
                yield self._chunks(path, piece, sent)
        finally:
            if ahead is not None:
                ahead.cancel()  # (an answered one: its response goes with the future)

    def stream_chunks(self, path: str, chunk_size: int) -> Iterator[bytes]:
        """:meth:`iter_chunks` in chunks of at least ``chunk_size`` bytes (but the last):
        for the helper process, where each chunk is one round trip."""
        checked_path(path, self.uri)
        return self._chunks(path, chunk_size)

    def iter_views(self, path: str, chunk_size: int = 4 << 20) -> Iterator[memoryview]:
        """The stream of :meth:`iter_chunks` as views of its chunks."""
        checked_path(path, self.uri)
        return self._views(self._chunks(path, min(chunk_size, STREAM_PIECE)))

    @staticmethod
    def _views(chunks: Iterator[bytes]) -> Iterator[memoryview]:
        try:
            for chunk in chunks:
                yield memoryview(chunk)
        finally:  # stopped early: drop the response now
            chunks.close()  # type: ignore[attr-defined]  # a generator

    def _chunks(
        self, path: str, chunk_size: int, sent: concurrent.futures.Future[Any] | None = None
    ) -> Iterator[bytes]:
        """``path``'s chunks; ``sent``: its GET already sent (see :meth:`iter_objects`)."""
        try:
            # obstore itself resumes a body broken mid-way (a ranged GET of the rest),
            # under the same retry settings as every request
            result = _obstore().get(self._client(), path) if sent is None else sent.result()
            for chunk in result.stream(min_chunk_size=chunk_size):
                # bytes from obstore 0.12 (a copy already: not copied again); anything
                # else (a buffer of obstore's own) becomes bytes here, as iter_chunks says
                yield chunk if type(chunk) is bytes else bytes(chunk)
        except StorageError:
            raise
        except Exception as exc:
            raise storage_error(exc, self.join(path), self._options) from exc

    def size(self, path: str) -> int:
        checked_path(path, self.uri)
        return int(self._call(self.join(path), _obstore().head, path)["size"])

    def exists(self, path: str) -> bool:
        try:
            self.size(path)
        except ObjectNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[str]:
        def walk(client: Any) -> list[str]:
            batches = _obstore().list(client, prefix=prefix or None)
            return [str(meta["path"]) for batch in batches for meta in batch]

        return iter(sorted(self._call(f"{self.uri}/{prefix}", walk)))

    def list_pages(
        self, folder: str = "", after: str | None = None
    ) -> Iterator[builtins.list[tuple[str, int]]]:
        """One LIST request per page, made when the page before it has been used.

        A key obstore cannot read as a path (a control character in it) fails its whole
        page; the rest of the listing then comes from :mod:`shardex.storage.s3_listing`,
        such names included, where the store allows it (S3 with static credentials)."""
        last = after
        try:
            pages = _obstore().list(
                self._client(), prefix=folder or None, offset=after, chunk_size=_PAGE
            )
            for page in pages:
                entries = [(str(meta["path"]), int(meta["size"])) for meta in page]
                yield entries
                last = entries[-1][0] if entries else last
        except StorageError:
            raise
        except Exception as exc:
            error = storage_error(
                exc, f"{self.uri}/{folder}/" if folder else f"{self.uri}/", self._options
            )
            rest = None
            if type(exc).__name__ == "InvalidPathError":
                from shardex.storage.s3_listing import raw_pages

                rest = raw_pages(self.uri, self._options, folder, last)
            if rest is None:
                raise error from exc
            try:
                yield from rest
            except OSError as again:  # the server refused or failed this request too
                raise error from again

    def list_folder(
        self, folder: str = ""
    ) -> tuple[builtins.list[str], builtins.list[tuple[str, int]]]:
        """One LIST with a delimiter per 1,000 entries (see :meth:`Storage.list_folder`)."""
        where = f"{self.uri}/{folder}/" if folder else f"{self.uri}/"
        found = self._call(where, _obstore().list_with_delimiter, folder or None)
        objects = [(str(meta["path"]), int(meta["size"])) for meta in found["objects"]]
        return sorted(map(str, found["common_prefixes"])), sorted(objects)

    def delete(self, path: str) -> None:
        checked_path(path, self.uri)
        self._call(self.join(path), _obstore().delete, path)

    def rename(self, source: str, target: str) -> None:
        checked_path(source, self.uri)
        checked_path(target, self.uri)
        self._call(self.join(source), _obstore().rename, source, target)

    def put(self, path: str, data: bytes | bytearray | memoryview) -> None:
        checked_path(path, self.uri)
        self._call(
            self.join(path),
            _obstore().put,
            path,
            bytes(data),
            chunk_size=PART_SIZE,
            max_concurrency=MAX_PARTS_IN_FLIGHT,
        )

    def get_tagged(self, path: str) -> tuple[bytes, str] | None:
        try:
            result = self._call(self.join(path), _obstore().get, path)
        except ObjectNotFoundError:
            return None
        return bytes(result.bytes()), str(result.meta["e_tag"])

    def put_if(self, path: str, data: bytes, tag: str | None) -> str | None:
        """A conditional put: ``If-None-Match: *`` (tag None) or ``If-Match: tag``."""
        obstore = _obstore()
        mode: Any = "create" if tag is None else {"e_tag": tag}
        try:
            result = obstore.put(self._client(), path, bytes(data), mode=mode, use_multipart=False)
        except (obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError):
            return None
        except FileNotFoundError:  # If-Match on an object that is gone
            return None
        except StorageError:
            raise
        except Exception as exc:
            raise storage_error(exc, self.join(path), self._options) from exc
        return str(result["e_tag"])

    def presign(self, path: str, expires_in: timedelta = timedelta(hours=1)) -> str:
        """A presigned GET URL of an object."""
        checked_path(path, self.uri)
        return str(self._call(self.join(path), _obstore().sign, "GET", path, expires_in))

    def open_writer(self, path: str) -> ObjectWriter:
        checked_path(path, self.uri)
        open_writer, where = _obstore().open_writer, self.join(path)
        sizes = {"buffer_size": PART_SIZE, "max_concurrency": MAX_PARTS_IN_FLIGHT}
        writer = self._call(where, open_writer, path, **sizes)
        return _MultipartWriter(writer, where, self._options)


class _MultipartWriter(CountingWriter):
    """obstore's writer: parts upload as they fill; completing makes the object appear."""

    def __init__(self, writer: Any, where: str, options: dict[str, Any]) -> None:
        super().__init__()
        self._w = writer
        self._where = where
        self._options = options

    def write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._w.write(data)
        except Exception as exc:
            self.abort()
            raise storage_error(exc, self._where, self._options) from exc
        self._pos += len(data)

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._w.close()
        except Exception as exc:
            raise storage_error(exc, self._where, self._options) from exc

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        # Leaving obstore's writer through an exception aborts the multipart upload.
        error = RuntimeError("aborted")
        with contextlib.suppress(Exception):  # already gone: nothing is visible either way
            self._w.__exit__(type(error), error, None)
