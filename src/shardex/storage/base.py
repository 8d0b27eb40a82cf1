"""The storage interface: a flat namespace of objects under one root.

Paths are relative, '/'-separated object names (``"train/images-ab12-000000.tar"``). The same
interface fits a local directory and an object store: whole and ranged reads, streaming
writes that become visible only on :meth:`ObjectWriter.commit`, listing and deletion.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

import xxhash

if TYPE_CHECKING:
    import concurrent.futures

    from shardex.storage.lock import OutputLock

from shardex.errors import StorageError
from shardex.names import relpath_problem


def checked_path(path: str, root: str) -> str:
    """``path`` when it names an object under the root; else a StorageError.

    The last line of defence: whatever a caller builds (a split name, a path read from
    config.yaml), a storage never reads or writes outside its root.
    """
    problem = relpath_problem(path)
    if problem is not None:
        raise StorageError(f"refused {problem} (storage {root!r})")
    return path


@runtime_checkable
class RangeReader(Protocol):
    """What a reader needs from a storage: sizes and byte ranges of objects."""

    def size(self, path: str) -> int: ...

    def get_range(self, path: str, start: int, length: int) -> bytes: ...

    def get_ranges(
        self, path: str, starts: Sequence[int], lengths: Sequence[int]
    ) -> list[bytes]: ...


class ObjectWriter(ABC):
    """A streaming write of one object, invisible under its name until :meth:`commit`.

    Use as a context manager: leaving the block normally commits, an exception aborts and
    removes what was written.
    """

    @abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes to the object."""

    def write_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Append the parts, in order, as :meth:`write` of their concatenation would
        (a local file writes them with one ``writev``, without joining them first)."""
        self.write(b"".join(parts))

    @abstractmethod
    def commit(self) -> None:
        """Make the object visible under its final name, atomically."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written; the final name is left untouched."""

    @property
    @abstractmethod
    def tell(self) -> int:
        """Number of bytes written so far."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class CountingWriter(ObjectWriter):
    """An :class:`ObjectWriter` whose :attr:`tell` is what its writes added to ``_pos``;
    ``_done`` is for its commit and abort to run once."""

    def __init__(self) -> None:
        self._pos = 0
        self._done = False

    @property
    def tell(self) -> int:
        return self._pos


class Forwarded:
    """A storage operation run by another storage, the instance's attribute ``to``, under
    the same name (on the class, a plain function: ``ObjectStorage.get(storage, path)``)."""

    def __init__(self, to: str) -> None:
        self._to = to

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, storage: Storage | None, owner: type | None = None) -> Any:
        return self if storage is None else getattr(getattr(storage, self._to), self._name)

    def __call__(self, storage: Storage, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(storage, self._to), self._name)(*args, **kwargs)


class Storage(ABC):
    """A root under which objects are read and written.

    Implementations override the abstract methods; ``get_ranges`` and ``put`` have generic
    versions built on the others. Instances must be picklable and safe to use after a fork
    (open handles are recreated per process).
    """

    #: URI of the root, e.g. ``/data/export`` or ``s3://bucket/prefix``.
    uri: str
    #: Batched reads (``get_many``) merge two ranges of one object when at most this many
    #: bytes lie between them; None: the reader's default (0 locally).
    coalesce_gap: int | None = None

    @abstractmethod
    def get(self, path: str) -> bytes:
        """Return the whole object. Raises ObjectNotFoundError when it is missing."""

    @abstractmethod
    def get_range(self, path: str, start: int, length: int) -> bytes:
        """Return ``length`` bytes from ``start``; short only at the end of the object."""

    def get_ranges(self, path: str, starts: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Return several ranges of one object, in the order asked."""
        return [self.get_range(path, s, n) for s, n in zip(starts, lengths, strict=True)]

    def get_head(self, path: str, length: int) -> tuple[bytes, int]:
        """The object's first ``length`` bytes (fewer if it is shorter) and its size;
        object stores answer both with one ranged GET."""
        size = self.size(path)
        return self.get_range(path, 0, min(length, size)), size

    def iter_chunks(self, path: str, chunk_size: int = 4 << 20) -> Iterator[bytes]:
        """The whole object as a stream of chunks (object stores: one GET)."""
        size = self.size(path)
        for start in range(0, size, chunk_size):
            yield self.get_range(path, start, min(chunk_size, size - start))

    def iter_objects(
        self, paths: Sequence[str], chunk_size: int = 4 << 20
    ) -> Iterator[Iterator[bytes]]:
        """:meth:`iter_chunks` of each path in turn (each to be read before asking for the
        next); an object store may send the next object's request while one is read."""
        for path in paths:
            yield self.iter_chunks(path, chunk_size)

    def iter_views(self, path: str, chunk_size: int = 4 << 20) -> Iterator[memoryview]:
        """:meth:`iter_chunks` as read-only views (for readers that copy out what they
        keep). Closing the iterator ends the request."""
        chunks = self.iter_chunks(path, chunk_size)
        try:
            for chunk in chunks:
                yield memoryview(chunk)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def get_range_batch(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Return ``(path, start, length)`` ranges of any objects, in the order asked.

        Remote stores run them concurrently; each range is still one request.
        """
        return [self.get_range(path, start, n) for path, start, n in requests]

    def submit_range_batch(
        self, requests: Sequence[tuple[str, int, int]]
    ) -> concurrent.futures.Future[builtins.list[bytes]]:
        """:meth:`get_range_batch` started now, for a caller with work to do meanwhile.

        Object stores send the requests at once and answer in the future; other storages
        read before returning.
        """
        import concurrent.futures  # here: only batches from object storage start early

        future: concurrent.futures.Future[builtins.list[bytes]] = concurrent.futures.Future()
        try:
            future.set_result(self.get_range_batch(requests))
        except Exception as exc:  # raised where the result is asked, as a remote read's
            future.set_exception(exc)
        return future

    @abstractmethod
    def size(self, path: str) -> int:
        """Size of the object in bytes. Raises ObjectNotFoundError when it is missing."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether the object exists."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Relative paths of the objects whose path starts with ``prefix``, sorted."""

    def list_pages(
        self, folder: str = "", after: str | None = None
    ) -> Iterator[builtins.list[tuple[str, int]]]:
        """The objects below ``folder`` ("" for the root) with their sizes, in path order,
        page by page as the store lists them (object stores: one LIST request per page
        of up to 1,000, the next asked for only when this one is used); ``after``: only
        the paths that sort after it."""
        names = builtins.list(self.list(f"{folder}/" if folder else ""))
        yield [(name, self.size(name)) for name in names if after is None or name > after]

    def list_folder(
        self, folder: str = ""
    ) -> tuple[builtins.list[str], builtins.list[tuple[str, int]]]:
        """What lies directly in ``folder`` ("" for the root): the paths of its subfolders
        and its own objects with their sizes, each in path order (object stores: a LIST
        with a delimiter, one request per 1,000 entries, all made before it returns; a
        subfolder costs one entry however many objects it holds)."""
        folders: dict[str, None] = {}
        objects: builtins.list[tuple[str, int]] = []
        cut = len(folder) + 1 if folder else 0
        for page in self.list_pages(folder):
            for path, size in page:
                head, sep, _ = path[cut:].partition("/")
                if sep:
                    folders[f"{folder}/{head}" if folder else head] = None
                else:
                    objects.append((path, size))
        return sorted(folders), objects

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove the object; a missing object is not an error."""

    @abstractmethod
    def open_writer(self, path: str) -> ObjectWriter:
        """Start a streaming write of ``path``; it is visible only once committed."""

    def rename(self, source: str, target: str) -> None:
        """Move an object to another name, replacing what is there (atomically where the
        store can: a local rename; a copy then a delete on object stores)."""
        self.put(target, self.get(source))
        self.delete(source)

    def put(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Write a whole object atomically."""
        with self.open_writer(path) as writer:
            writer.write(data)

    def lock(self, holder: str) -> OutputLock:
        """Take the output's writer lock (see :mod:`shardex.storage.lock`): a lease on an
        object, renewed while held. Raises OutputLockedError when another writer holds it."""
        from shardex.storage.lock import LeaseLock

        return LeaseLock(self, holder)

    def get_tagged(self, path: str) -> tuple[bytes, str] | None:
        """The object and its version tag (an ETag), or None when it is missing."""
        from shardex.errors import ObjectNotFoundError

        try:
            data = self.get(path)
        except ObjectNotFoundError:
            return None
        return data, xxhash.xxh3_64_hexdigest(data)

    def put_if(self, path: str, data: bytes, tag: str | None) -> str | None:
        """Write ``path`` only if it is missing (``tag`` None) or still has ``tag``; return
        its new tag, or None when that condition failed. Object stores do this atomically
        (conditional puts); this generic version checks, then writes."""
        found = self.get_tagged(path)
        if (found is None) != (tag is None) or (found is not None and found[1] != tag):
            return None
        self.put(path, data)
        return xxhash.xxh3_64_hexdigest(data)

    def leftovers(self) -> builtins.list[str]:
        """Writes that never committed (a killed process's temporary files), by path.

        Object stores hide unfinished multipart uploads, so they report none.
        """
        return []

    def remove_leftovers(self) -> None:
        """Delete what :meth:`leftovers` reports."""
        for path in self.leftovers():
            self.delete(path)

    def sync(self, paths: Iterable[str]) -> None:
        """Make committed objects durable (a no-op where commit already is, as on S3)."""
        del paths

    def local_path(self, path: str) -> Path | None:
        """The object's local file, when it has one (lets readers mmap); else None."""
        return None

    def join(self, path: str) -> str:
        """The full URI of an object, for messages."""
        return f"{self.uri.rstrip('/')}/{path}"


class BatchedStorage(Storage):
    """A storage whose batches of ranged reads run concurrently and hedged on this
    process's I/O loop (:mod:`shardex.storage.batch`): it supplies :meth:`_batch`."""

    async def _batch(self, requests: Sequence[tuple[str, int, int]]) -> builtins.list[bytes]:
        raise NotImplementedError

    def get_ranges(
        self, path: str, starts: Sequence[int], lengths: Sequence[int]
    ) -> builtins.list[bytes]:
        return self.get_range_batch([(path, s, n) for s, n in zip(starts, lengths, strict=True)])

    def get_range_batch(self, requests: Sequence[tuple[str, int, int]]) -> builtins.list[bytes]:
        if len(requests) <= 1:
            return [self.get_range(*r) for r in requests]
        from shardex.storage.batch import run

        return run(self._batch(requests))

    def submit_range_batch(
        self, requests: Sequence[tuple[str, int, int]]
    ) -> concurrent.futures.Future[builtins.list[bytes]]:
        from shardex.storage.batch import event_loop

        return event_loop().submit(self._batch(requests))
