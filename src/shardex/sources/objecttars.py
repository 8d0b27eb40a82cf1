"""WebDataset tars on object storage: a prefix (every ``.tar`` below it), a glob
(``s3://bucket/shards/train-*.tar``, ``**`` for any folders) or one ``.tar`` URL.

Each tar is read once, as a stream: one GET, its headers parsed as the bytes arrive (the
same parser and the same damage checks as a local tar, see :mod:`shardex.sources.tars`),
each member's bytes kept with its sample, so no byte is fetched again when the shards are
written. Memory holds a read-ahead of a few MiB of the tar and the batch being filled.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any, Final

from shardex.errors import EmptySourceError, SourceNotFoundError
from shardex.storage import Storage, open_storage

_GLOB: Final = "*?["
#: Bytes of a tar kept behind the parser: tarfile and the header reader step back at most
#: a block or two (to where the previous member's data ended).
_LOOKBACK: Final = 1 << 16
_TRIM: Final = 4 << 20


class _Stream:
    """A tar read as one GET, as a file that seeks forward (and back a little)."""

    def __init__(self, chunks: Iterator[bytes], size: int, where: str) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._start = 0  # the tar offset of _buf[0]
        self._pos = 0
        self._size = size
        self.name = where

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (self._pos if whence == 1 else self._size if whence == 2 else 0)
        if target < self._start:
            raise OSError(f"cannot go back to byte {target} of a tar read as a stream")
        self._pos = target
        return target

    def read(self, n: int = -1) -> bytes:
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


def open_tar_stream(storage: Storage, path: str, size: int) -> _Stream:
    """The tar at ``path`` read as one streamed GET (see :class:`_Stream`)."""
    return _Stream(storage.iter_chunks(path), size, storage.join(path))


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
