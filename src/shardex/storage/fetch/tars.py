"""WebDataset tars on object storage: a prefix, a glob (``**`` for any folders) or one URL.

:class:`RangedTar` scans member headers with ranged GETs that hop from header to header
(a window from :data:`MIN_WINDOW`, doubling up to :data:`MAX_WINDOW` where headers are
close); members stay references, fetched by the shard writers. So that nothing is
fetched twice, an export writing locally keeps what the scan read in sparse files on
scratch (:func:`copies_kept`), room permitting (else one RefetchWarning); Ray holds it
in its object store instead (:mod:`shardex.storage.fetch.held`).
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import fnmatch
import itertools
import os
import shutil
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from shardex.errors import EmptySourceError, RefetchWarning, SourceNotFoundError
from shardex.quoting import quoted
from shardex.storage import Storage, open_storage
from shardex.storage.fetch.held import TarHold

_GLOB: Final = "*?["
#: A hop's read: a header and the small members after it (``.cls``, ``.json``).
MIN_WINDOW: Final = 4 << 10
MAX_WINDOW: Final = 2 << 20
#: A member smaller than this is read through: a request costs more (docs/storage.md).
READ_THROUGH: Final = 64 << 10
#: With a copy and a grown window, a member up to this many windows (and MAX_WINDOW) is
#: read on into the copy, not hopped over: hopping refetched 1.12-1.26x the bytes of
#: tars mixing tiny and ~100 KB samples.
READ_ON: Final = 49
#: Free scratch space tar copies never take (the export's spills and others need some).
COPY_RESERVE: Final = 1 << 30
#: The export's own scratch files' share of the tars' bytes (8 % measured at worst).
SCRATCH_SHARE: Final = 0.25
#: Whether an export keeps copies of what the scan read (benchmarks compare both).
KEEP_COPIES = True


class TarCopies:
    """Copies of what tar scans read, in an export's local scratch; shared by scan threads."""

    def __init__(self, folder: Path, output: Path | None = None) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._pending = 0  # bytes claimed by copies being written
        self._shared = output is not None and _same_disk(folder, output)
        self._owed = 0  # bytes the export's scratch files (and such an output) will take
        self._warned = False
        self._open: set[TarCopy] = set()
        self._stops: set[threading.Event] = set()  # of the scans under way
        self.frozen = False  # no copy is made or written any more
        self.kept, self.refused = 0, 0  # bytes the copies hold; tars not copied (no room)

    def start(self, url: str, size: int) -> TarCopy | None:
        """A new copy of the tar at ``url``, or None (warned once) if the scratch has no room."""
        with self._lock:  # made under the lock: never after freeze() (the folder's end)
            if self.frozen:
                return None
            free = _free_space(self.folder) - self._pending - self._owed
            if free - size < COPY_RESERVE:
                self._warn(url, size, free)
                return None
            path = self.folder / f"{next(self._numbers):08d}.tar"
            try:
                copy = TarCopy(self, path, size)
            except OSError as exc:
                self._warn(url, size, free, exc.strerror)
                return None
            self._pending += size
            self._open.add(copy)
            return copy

    def watch(self, stop: threading.Event) -> None:
        """A scan under way stops when ``stop`` is set: :meth:`freeze` sets it."""
        with self._lock:
            if self.frozen:
                stop.set()
            self._stops.add(stop)

    def unwatch(self, stop: threading.Event) -> None:
        with self._lock:
            self._stops.discard(stop)

    def freeze(self) -> None:
        """Stop the scans under way and close every copy; none is made or written after."""
        with self._lock:
            self.frozen = True
            for stop in self._stops:
                stop.set()
            still = list(self._open)
        for copy in still:
            copy.close()

    def expect(self, total: int) -> None:
        """Reserve the room the export's files (and a same-disk output) take for ``total``
        bytes of tars."""
        with self._lock:
            self._owed += int(total * SCRATCH_SHARE) + (total if self._shared else 0)

    def done(self, copy: TarCopy, claimed: int, kept: int) -> None:
        """``copy``, which claimed ``claimed`` bytes, is complete, holding ``kept`` (or gone)."""
        with self._lock:
            self._open.discard(copy)
            self._pending -= claimed
            self.kept += kept

    def _warn(self, url: str, size: int, free: int, why: str | None = None) -> None:
        self.refused += 1
        if self._warned:
            return
        self._warned = True
        reason = why or (
            f"{max(free + self._owed, 0):,} bytes free, {COPY_RESERVE:,} kept free"
            + (f" and {self._owed:,} for the export's files" if self._owed else "")
        )
        warnings.warn(
            f"no room for a copy of tar {quoted(url)} ({size:,} bytes) in the export's "
            f"scratch folder {quoted(str(self.folder))} ({reason}): the members this and "
            "other such tars' scan read are fetched again when their shards are written; "
            "set TMPDIR to a local folder with more free space to fetch them once",
            RefetchWarning,
            stacklevel=2,
        )


def _same_disk(folder: Path, output: Path) -> bool:
    """Whether ``output`` (or its nearest folder that exists) is on ``folder``'s disk."""
    for where in (output, *output.parents):
        with contextlib.suppress(OSError):
            return os.stat(where).st_dev == os.stat(folder).st_dev
    return True  # unknown: taken as shared (copies are the part that may be refused)


def _free_space(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


class TarCopy:
    """One tar's copy: a sparse file of the fetched bytes at their places, ranges tracked."""

    def __init__(self, copies: TarCopies, path: Path, size: int) -> None:
        self._copies, self.path, self._size = copies, path, size
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        # freeze() closes from another thread: a reused descriptor must not be written
        self._lock = threading.Lock()
        self._starts: list[int] = []  # the ranges held: [start, end), sorted, apart
        self._ends: list[int] = []
        self.used = False  # whether a member names the copy

    def put(self, start: int, data: bytes) -> None:
        """Keep ``data``, bytes ``start`` on of the tar (a failed write: not kept)."""
        with self._lock:
            if self._fd is None or not data:
                return
            try:  # a disk filling up takes a write in part: only what it took is held
                written = os.pwrite(self._fd, data, start)
            except OSError:
                return  # a full disk: these bytes are fetched again by the shard
            if written:
                self._add(start, start + written)

    def _add(self, start: int, end: int) -> None:
        i = bisect.bisect_left(self._ends, start)  # the first range that ends at or after
        j = bisect.bisect_right(self._starts, end)  # past the last that starts at or before
        if i < j:
            start, end = min(start, self._starts[i]), max(end, self._ends[j - 1])
        self._starts[i:j], self._ends[i:j] = [start], [end]

    def holds(self, offset: int, size: int) -> bool:
        """Whether bytes ``[offset, offset + size)`` of the tar are in the copy."""
        i = bisect.bisect_right(self._starts, offset) - 1
        return i >= 0 and offset + size <= self._ends[i]

    def forget(self, before: int) -> None:
        """Ranges that end before ``before`` will not be asked about again: dropped."""
        i = bisect.bisect_right(self._ends, before)
        if i > 1:  # the last one kept: a member's bytes may start in it
            del self._starts[: i - 1], self._ends[: i - 1]

    def close(self) -> None:
        """The copy complete (removed if no member names it)."""
        with self._lock:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            kept = os.fstat(fd).st_blocks * 512 if self.used else 0  # what the sparse file takes
            os.close(fd)
            if not self.used:
                with contextlib.suppress(OSError):
                    self.path.unlink()
        self._copies.done(self, self._size, kept)


_COPIES: contextvars.ContextVar[TarCopies | None] = contextvars.ContextVar(
    "shardex_tar_copies", default=None
)


@contextlib.contextmanager
def copies_kept(folder: Path, output: Path | None = None) -> Iterator[TarCopies]:
    """Tar sources on object storage opened in this context keep copies of what their
    scans read under ``folder``; ``output`` is a local output whose room copies leave."""
    folder.mkdir(exist_ok=True)
    copies = TarCopies(folder, output)
    token = _COPIES.set(copies if KEEP_COPIES else None)
    try:
        yield copies
    finally:
        _COPIES.reset(token)
        copies.freeze()


def kept_copies() -> TarCopies | None:
    """The copies of the :func:`copies_kept` this context is in, if any."""
    return _COPIES.get()


class RangedTar:
    """A tar on object storage as a file read by ranged GETs, holding the last window;
    ``requests`` and ``fetched`` count what it asked for."""

    def __init__(
        self, storage: Storage, path: str, size: int, copy: TarCopy | TarHold | None = None
    ) -> None:
        self._storage, self._path, self._size = storage, path, size
        self.copy = copy  # what keeps the bytes fetched: a local copy, or a Ray task's parts
        self._buf = b""
        self._start = 0  # the tar offset of _buf[0]
        self._pos = 0
        self._done = 0  # where the last read ended: what the parser skips begins there
        self._window = MIN_WINDOW
        self.name = storage.join(path)
        self.requests = 0
        self.fetched = 0

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset + (self._pos if whence == 1 else self._size if whence == 2 else 0)
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        left = max(self._size - self._pos, 0)
        n = left if n is None or n < 0 else min(n, left)
        if n == 0:
            return b""
        end = self._start + len(self._buf)
        held = self._start <= self._pos and self._pos + n <= end
        follows = bool(self._buf) and self._start <= self._pos <= end + self._reach(end)
        if held:
            pass
        elif follows:
            # just past the bytes held: read on (cheaper than a request), window doubling
            self._window = min(2 * self._window, MAX_WINDOW)
            more = self._get(end, max(self._pos + n - end, self._window))
            keep = self._buf[self._pos - self._start :] if self._pos < end else b""
            self._buf, self._start = keep + more[max(self._pos - end, 0) :], self._pos
        else:  # a hop past a large member (or back): a small window from there
            self._window = MIN_WINDOW
            self._buf, self._start = self._get(self._pos, max(n, self._window)), self._pos
        lo = self._pos - self._start
        data = self._buf[lo : lo + n]
        self._pos += len(data)
        self._done = self._pos
        return data

    def _reach(self, end: int) -> int:
        """How far past ``end`` a read still reads on rather than hops (see READ_ON)."""
        fetched = end - self._done  # of what the parser skipped since its last read
        grown = max(fetched, self._window)
        if self.copy is None or grown <= MIN_WINDOW:  # without a copy: fetched again
            return READ_THROUGH
        return max(READ_THROUGH, min(READ_ON * grown, MAX_WINDOW))

    def _get(self, start: int, length: int) -> bytes:
        length = min(length, self._size - start)
        self.requests += 1
        data = self._storage.get_range(self._path, start, length)
        self.fetched += len(data)
        if self.copy is not None:
            self.copy.put(start, data)
        return data

    def close(self) -> None:
        self._buf = b""
        if self.copy is not None:
            self.copy.close()


def open_object_tar(
    storage: Storage,
    path: str,
    size: int,
    copies: TarCopies | None = None,
    hold: TarHold | None = None,
) -> RangedTar:
    """The tar at ``path`` as a file to scan, its reads kept in ``hold`` or a new copy."""
    if hold is not None:
        return RangedTar(storage, path, size, hold)
    copy = copies.start(storage.join(path), size) if copies is not None else None
    return RangedTar(storage, path, size, copy)


def _matches(path: str, pattern: str) -> bool:
    """Whether a path matches a glob as :func:`glob.glob` with ``recursive=True``."""
    parts, pats = path.split("/"), pattern.split("/")

    def match(i: int, j: int) -> bool:
        if j == len(pats):
            return i == len(parts)
        if pats[j] == "**":
            return any(match(k, j + 1) for k in range(i, len(parts) + 1))
        return i < len(parts) and fnmatch.fnmatchcase(parts[i], pats[j]) and match(i + 1, j + 1)

    return match(0, 0)


def object_tars(url: str, options: dict[str, Any] | None) -> tuple[Storage, list[tuple[str, int]]]:
    """The storage and the tars (path below its root, size) a URL names, in path order;
    SourceNotFoundError for a missing ``.tar`` URL, EmptySourceError for no tar at all."""
    cut = min((url.find(c) for c in _GLOB if c in url), default=-1)
    if cut >= 0:
        base, _, pattern = url[:cut].rpartition("/")
        pattern += url[cut:]
        storage = open_storage(base, options)
        found = [(p, n) for page in storage.list_pages("") for p, n in page if _matches(p, pattern)]
    elif url.lower().endswith(".tar") and not url.endswith("/"):
        base, _, name = url.rpartition("/")
        storage = open_storage(base, options)
        from shardex.errors import ObjectNotFoundError

        try:
            found = [(name, storage.size(name))]
        except ObjectNotFoundError as exc:
            raise SourceNotFoundError(f"no tar file at {url}") from exc
    else:
        storage = open_storage(url.rstrip("/"), options)
        found = [(p, n) for page in storage.list_pages("") for p, n in page if p.endswith(".tar")]
    if not found:
        raise EmptySourceError(f"no .tar files match {url!r}")
    return storage, sorted(found)
