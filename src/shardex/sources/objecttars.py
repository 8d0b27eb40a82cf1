"""WebDataset tars on object storage: a prefix (every ``.tar`` below it), a glob
(``s3://bucket/shards/train-*.tar``, ``**`` for any folders) or one ``.tar`` URL.

A tar is scanned for its member headers (the same parser and the same damage checks as
a local tar, see :mod:`shardex.sources.tars`) through :class:`RangedTar`: ranged GETs
that hop from header to header, each of a small window (:data:`MIN_WINDOW`) that holds
the header and the small members after it (``.cls``, ``.json``: read while scanning), so
a large member's bytes are skipped. Where headers follow each other closely (a tar of
tiny members) the window doubles at each read, up to :data:`MAX_WINDOW` (2 MiB): such a tar is read
through in few requests, as a stream would read it. Members are kept as references
(object URL, offset, size): their bytes are fetched when the shards are written, by the
workers writing them (see :mod:`shardex.sources.remote`), never held by the scan.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Final, Literal

from shardex.errors import EmptySourceError, SourceNotFoundError
from shardex.storage import Storage, open_storage

_GLOB: Final = "*?["
#: The first (and smallest) read of a hop to a header: the header and, in a WebDataset
#: tar, the small members that follow it (``.cls``, ``.json``: 1.5 KiB with headers).
MIN_WINDOW: Final = 4 << 10
#: The largest read: where headers follow closely, each read doubles up to this.
MAX_WINDOW: Final = 2 << 20
#: A member smaller than this is read through rather than hopped over (one more request
#: costs more time than these bytes; see docs/storage.md for what each costs).
READ_THROUGH: Final = 64 << 10
#: Bytes of a tar kept behind the parser by a stream: tarfile and the header reader step
#: back at most a block or two (to where the previous member's data ended).
_LOOKBACK: Final = 1 << 16
_TRIM: Final = 4 << 20


class RangedTar:
    """A tar on object storage as a file read by ranged GETs of what is asked: a read
    outside the bytes held fetches a window from there (see the module docstring); the
    bytes held are the last window, at most :data:`MAX_WINDOW` (or one member read
    whole: a ``.json``). ``requests`` and ``fetched`` count what it asked for."""

    def __init__(self, storage: Storage, path: str, size: int) -> None:
        self._storage, self._path, self._size = storage, path, size
        self._buf = b""
        self._start = 0  # the tar offset of _buf[0]
        self._pos = 0
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
        follows = bool(self._buf) and self._start <= self._pos <= end + READ_THROUGH
        if held:
            pass
        elif follows:
            # what follows the bytes held, or a little past them: read on (the skipped
            # bytes cost less than a request), each read twice the last, up to MAX_WINDOW
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
        return data

    def _get(self, start: int, length: int) -> bytes:
        length = min(length, self._size - start)
        self.requests += 1
        data = self._storage.get_range(self._path, start, length)
        self.fetched += len(data)
        return data

    def close(self) -> None:
        self._buf = b""


class TarStream:
    """A tar read as one GET, as a file that seeks forward (and back a little): the
    other way to scan a tar, kept to measure against :class:`RangedTar` (it reads every
    byte of the tar, so members are fetched twice: here and when written)."""

    def __init__(self, storage: Storage, path: str, size: int) -> None:
        self._chunks = storage.iter_chunks(path)
        self._buf = bytearray()
        self._start = 0  # the tar offset of _buf[0]
        self._pos = 0
        self._size = size
        self.name = storage.join(path)

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (self._pos if whence == 1 else self._size if whence == 2 else 0)
        if target < self._start:
            raise OSError(f"cannot go back to byte {target} of a tar read as a stream")
        self._pos = target
        return target

    def read(self, n: int | None = -1) -> bytes:
        n = max(self._size - self._pos, 0) if n is None or n < 0 else n
        end = self._pos + n
        while self._start + len(self._buf) < end:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf += chunk
        lo = self._pos - self._start
        data = bytes(self._buf[lo : lo + n])
        self._pos += len(data)
        dead = self._pos - _LOOKBACK - self._start
        if dead > _TRIM:  # rarely: dropping the front of a bytearray moves the rest
            del self._buf[:dead]
            self._start += dead
        return data

    def close(self) -> None:
        self._chunks.close()  # type: ignore[attr-defined]  # a generator: ends the GET


#: How tars on object storage are scanned: "ranged" (:class:`RangedTar`) or "stream"
#: (:class:`TarStream`; benchmarks and tests compare both).
SCAN: Literal["ranged", "stream"] = "ranged"


def open_object_tar(storage: Storage, path: str, size: int) -> RangedTar | TarStream:
    """The tar at ``path`` as a file to scan (see :data:`SCAN`)."""
    if SCAN == "stream":
        return TarStream(storage, path, size)
    return RangedTar(storage, path, size)


def _matches(path: str, pattern: str) -> bool:
    """Whether a '/'-separated path matches a glob (``*`` within a folder name, ``**``
    any number of folders), as :func:`glob.glob` with ``recursive=True``."""
    parts, pats = path.split("/"), pattern.split("/")

    def match(i: int, j: int) -> bool:
        if j == len(pats):
            return i == len(parts)
        if pats[j] == "**":
            return any(match(k, j + 1) for k in range(i, len(parts) + 1))
        return i < len(parts) and fnmatch.fnmatchcase(parts[i], pats[j]) and match(i + 1, j + 1)

    return match(0, 0)


def object_tars(url: str, options: dict[str, Any] | None) -> tuple[Storage, list[tuple[str, int]]]:
    """The storage and the tars (path below its root, size) a URL names, in path order.

    Raises:
        SourceNotFoundError: a ``.tar`` URL that does not exist.
        EmptySourceError: no tar below the prefix or matching the glob.
    """
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
