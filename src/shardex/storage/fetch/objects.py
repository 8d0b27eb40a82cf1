"""Where members of sources on object storage come from: the source's storage,
registered here as it is scanned and carried to shard writers by
:class:`shardex.refs.members.Members`; :class:`ObjectReads` fetches expected members
ahead, coalescing adjacent ranges into one GET.
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

MAX_IN_FLIGHT: Final = 16
MAX_AHEAD_BYTES: Final = 64 << 20
#: Bytes between two members (tar headers, small members) one GET reads through.
MAX_GAP: Final = 16 << 10
MAX_RUN: Final = 8 << 20

_stores: dict[str, Storage] = {}
_lock = threading.Lock()


def is_url(text: str) -> bool:
    """Whether ``text`` is an object-store URL (``s3://``, ``gs://``, ``memory://`` ...)."""
    return text.startswith(URL_SCHEMES)


def split_url(url: str) -> tuple[str, str]:
    """``s3://b/x/y.jpg`` -> (``s3://b``, ``x/y.jpg``)."""
    scheme, _, rest = url.partition("://")
    bucket, _, path = rest.partition("/")
    return f"{scheme}://{bucket}", path


def register(storage: Storage) -> None:
    """Make ``storage`` the one that serves member URLs of its bucket; an earlier store of
    the bucket goes, as its longer root would serve these URLs with its credentials."""
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
    """``data`` of ``name``, listed as ``size`` bytes; BadSampleError if it changed."""
    if len(data) != size:
        raise BadSampleError(
            f"{quoted(name)} changed while exporting: it was {size} bytes, now {len(data)}",
            path=name,
            reason="changed during export",
        )
    return data


@dataclass(eq=False, slots=True)
class _Run:
    """One GET of bytes ``[start, start + size)``, with ``left`` members not read yet."""

    future: Future[bytes]
    start: int
    size: int
    left: int


class ObjectReads:
    """Member bytes of objects, fetched concurrently ahead of the reader. ``stores``: by
    root URL; a URL uses the longest matching root, else its bucket with default options."""

    def __init__(self, stores: Iterable[tuple[str, Storage]] = ()) -> None:
        self._roots = sorted(dict(stores).items(), key=lambda kv: -len(kv[0]))
        self._buckets: dict[str, Storage] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[int, _Run] = {}  # member number -> the GET that reads it
        self._runs: set[_Run] = set()  # GETs whose members are not all read
        self._ahead_bytes = 0
        self._queue: deque[tuple[int, str, int, int]] = deque()
        self._queued: set[int] = set()  # numbers in the queue not read yet
        self.requests = 0

    def expect(self, members: Iterable[tuple[int, str, int, int]]) -> None:
        """Members (number, URL, offset, size) that will be read, in order: fetched ahead."""
        for member in members:
            self._queue.append(member)
            self._queued.add(member[0])
        self._top_up()

    def read(self, number: int, url: str, offset: int, size: int) -> bytes:
        """The bytes of a member (``offset`` -1: the whole object); a BadSampleError if it
        is gone or changed size since the scan, a StorageError if the store fails."""
        run = self._ahead.pop(number, None)
        if run is None:
            self._queued.discard(number)  # read now: never fetched ahead after this
            self.requests += 1
            data = self._get(url, offset, size)
        else:
            try:
                whole = run.future.result()
            finally:  # only then: the last member read cancels what is not running yet
                self._done_with(run)
            data = whole if offset < 0 else whole[offset - run.start : offset - run.start + size]
        # a short or long answer (a whole object read whole) shows it changed
        data = sized(data, size, url)
        # read in order: earlier ones never read (a bad sample's rest) free their places
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
        number, other, offset, size = member
        return (
            other == url
            and number in self._queued
            and end <= offset <= end + MAX_GAP
            and offset + size - start <= MAX_RUN
        )

    def _get(self, url: str, offset: int, size: int) -> bytes:
        storage, path = self._storage(url)
        try:
            return storage.get(path) if offset < 0 else storage.get_range(path, offset, size)
        except ObjectNotFoundError as exc:
            raise BadSampleError(
                f"cannot read {quoted(url)}: it does not exist (any more)",
                path=url,
                reason=f"cannot read {quoted(url)}: it does not exist",
            ) from exc

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
        self._runs.clear()  # their futures are the pool's, cancelled with it
        self._ahead.clear()
        self._ahead_bytes = 0
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
