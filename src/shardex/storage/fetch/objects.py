"""Sources on object storage: where their members' bytes come from.

A member of a source on object storage names its object by URL (``s3://bucket/a/b.jpg``)
in the ``path`` of its ``_members`` entry. The source's storage (its endpoint, region and
credentials, which may differ from the output's) is registered here when the source is
streamed, in the process that scans it; :class:`shardex.refs.members.Members` takes the stores its
URLs need from here and carries them, pickled, to the workers that write the shards.

:class:`ObjectReads` fetches members: whole objects with one GET each, ranges of one
object (members of a tar) that follow each other in the order they will be read with one
ranged GET for the run (at most :data:`MAX_GAP` bytes skipped between two, at most
:data:`MAX_RUN` bytes in all), at most :data:`MAX_IN_FLIGHT` requests at a time, ahead of
the writer in the order it will read them, never past what it was told to expect (so a
member is fetched once, by the shard that writes it). Transient failures (dropped
connections, timeouts, 5xx, throttling) are retried by the storage layer (storage option
``retry_timeout``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from shardex.errors import BadSampleError, ObjectNotFoundError
from shardex.quoting import quoted
from shardex.storage import Storage, open_storage
from shardex.storage.options import URL_SCHEMES

__all__ = [
    "MAX_GAP",
    "MAX_IN_FLIGHT",
    "MAX_RUN",
    "ObjectReads",
    "is_url",
    "register",
    "registered",
    "split_url",
]

#: Requests in flight at once (per shard writer), and the bytes fetched ahead at most.
MAX_IN_FLIGHT: Final = 16
MAX_AHEAD_BYTES: Final = 64 << 20
#: Bytes between two members of one object that one GET reads through (tar headers, the
#: ``.cls`` and ``.json`` members already read by the scan) rather than asking twice.
MAX_GAP: Final = 16 << 10
#: The most bytes one coalesced GET reads (a run of members is cut there).
MAX_RUN: Final = 8 << 20

_stores: dict[str, Storage] = {}
_lock = threading.Lock()


def is_url(text: str) -> bool:
    """Whether ``text`` is an object-store URL (``s3://``, ``gs://``, ``memory://`` ...)."""
    return text.startswith(URL_SCHEMES)


def split_url(url: str) -> tuple[str, str]:
    """An object URL as its bucket root and the path below it:
    ``s3://b/x/y.jpg`` -> (``s3://b``, ``x/y.jpg``)."""
    scheme, _, rest = url.partition("://")
    bucket, _, path = rest.partition("/")
    return f"{scheme}://{bucket}", path


def register(storage: Storage) -> None:
    """Make ``storage`` the one that serves member URLs of its bucket (the source's
    options, credentials included, stay in memory and travel only pickled to workers).

    A store an earlier source registered in the same bucket goes: its root may be longer
    than this one's (``s3://b/imgs`` then ``s3://b``) and would otherwise keep serving
    this source's URLs below it, with the earlier source's endpoint and credentials."""
    root = storage.uri.rstrip("/")
    bucket = split_url(root)[0]
    with _lock:
        for other in [r for r in _stores if split_url(r)[0] == bucket]:
            del _stores[other]
        _stores[root] = storage


def registered() -> tuple[tuple[str, Storage], ...]:
    """The stores registered in this process, by root URL."""
    with _lock:
        return tuple(_stores.items())


def sized(data: bytes, size: int, name: str) -> bytes:
    """``data``, read from ``name`` (a file or object) listed as ``size`` bytes, or a bad
    sample if it changed since it was listed."""
    if len(data) != size:
        raise BadSampleError(
            f"{quoted(name)} changed while exporting: it was {size} bytes, now {len(data)}",
            path=name,
            reason="changed during export",
        )
    return data


@dataclass(eq=False, slots=True)
class _Run:
    """One GET in flight or done: bytes ``[start, start + size)`` of an object, holding
    ``left`` members not read yet."""

    future: Future[bytes]
    start: int
    size: int
    left: int


class ObjectReads:
    """Member bytes of objects, fetched concurrently ahead of the reader.

    Args:
        stores: storages by root URL (a member URL is read from the longest root it
            starts with; one with no registered root from its bucket, with the options
            of the environment).
    """

    def __init__(self, stores: Iterable[tuple[str, Storage]] = ()) -> None:
        self._roots = sorted(dict(stores).items(), key=lambda kv: -len(kv[0]))
        self._buckets: dict[str, Storage] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[int, _Run] = {}  # member number -> the GET that reads it
        self._runs: set[_Run] = set()  # GETs whose members are not all read
        self._ahead_bytes = 0
        self._queue: deque[tuple[int, str, int, int]] = deque()
        self._queued: set[int] = set()  # numbers in the queue not read yet
        #: GETs sent (ahead, or for a member read at once).
        self.requests = 0

    def expect(self, members: Iterable[tuple[int, str, int, int]]) -> None:
        """Members (number, URL, offset, size) that will be read, in the order they will
        be: they are fetched ahead, a few GETs at a time."""
        for member in members:
            self._queue.append(member)
            self._queued.add(member[0])
        self._top_up()

    def read(self, number: int, url: str, offset: int, size: int) -> bytes:
        """The bytes of a member (``offset`` -1: the whole object).

        Raises:
            BadSampleError: the object is gone, or its size changed since the scan.
            StorageError: the store cannot be read (unreachable, access denied).
        """
        run = self._ahead.pop(number, None)
        if run is None:
            self._queued.discard(number)  # read now: never fetched ahead after this
            data = self._fetch(url, offset, size)
        else:
            try:
                whole = run.future.result()
            finally:  # only then: the last member read cancels what is not running yet
                self._done_with(run)
            data = whole if offset < 0 else whole[offset - run.start : offset - run.start + size]
            data = sized(data, size, url)
        # members are read in order: those fetched ahead of this one and never read (the
        # rest of a sample found bad) are dropped, to free their places
        for stale in [n for n in self._ahead if n < number]:
            self._done_with(self._ahead.pop(stale))
        self._top_up()
        return data

    def _done_with(self, run: _Run) -> None:
        run.left -= 1
        if run.left == 0:
            self._runs.discard(run)
            self._ahead_bytes -= run.size
            run.future.cancel()  # a no-op once it has started

    def _top_up(self) -> None:
        while (
            self._queue
            and len(self._runs) < MAX_IN_FLIGHT
            and (not self._runs or self._ahead_bytes < MAX_AHEAD_BYTES)
        ):
            first = self._queue.popleft()
            if first[0] not in self._queued or first[0] in self._ahead:
                continue
            self._queued.discard(first[0])
            numbers, url, start, end = [first[0]], first[1], first[2], first[2] + first[3]
            while start >= 0 and self._queue and self._follows(self._queue[0], url, start, end):
                number, _, offset, size = self._queue.popleft()
                self._queued.discard(number)
                numbers.append(number)
                end = offset + size
            size = end - start if start >= 0 else first[3]
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_IN_FLIGHT, "shardex-source-read")
            self.requests += 1
            run = _Run(self._pool.submit(self._get, url, start, size), start, size, len(numbers))
            self._runs.add(run)
            self._ahead_bytes += size
            for number in numbers:
                self._ahead[number] = run

    def _follows(self, member: tuple[int, str, int, int], url: str, start: int, end: int) -> bool:
        """Whether ``member`` is read by the same GET as bytes ``[start, end)`` of ``url``."""
        number, other, offset, size = member
        return (
            other == url
            and number in self._queued
            and end <= offset <= end + MAX_GAP
            and offset + size - start <= MAX_RUN
        )

    def _get(self, url: str, offset: int, size: int) -> bytes:
        """Bytes of an object as they are (a run: checked member by member)."""
        storage, path = self._storage(url)
        try:
            return storage.get(path) if offset < 0 else storage.get_range(path, offset, size)
        except ObjectNotFoundError as exc:
            raise BadSampleError(
                f"cannot read {quoted(url)}: it does not exist (any more)",
                path=url,
                reason=f"cannot read {quoted(url)}: it does not exist",
            ) from exc

    def _fetch(self, url: str, offset: int, size: int) -> bytes:
        # a whole object is read whole: a short or long answer shows it changed
        self.requests += 1
        return sized(self._get(url, offset, size), size, url)

    def _storage(self, url: str) -> tuple[Storage, str]:
        for root, storage in self._roots:
            if url.startswith(root + "/"):
                return storage, url[len(root) + 1 :]
        bucket, path = split_url(url)
        if bucket not in self._buckets:
            self._buckets[bucket] = open_storage(bucket)
        return self._buckets[bucket], path

    def close(self) -> None:
        """Stop fetching ahead (requests in flight end on their own)."""
        self._queue.clear()
        self._queued.clear()
        for run in self._runs:
            run.future.cancel()
        self._runs.clear()
        self._ahead.clear()
        self._ahead_bytes = 0
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
