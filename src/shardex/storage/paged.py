"""Index files of a remote export read by pages on demand, into a local sparse copy.

A 10M-sample export's index is ~560 MB: downloading it whole before a fresh node's first
sample costs minutes. Instead the copy is a sparse file of the object's size, filled
:data:`PAGE` bytes at a time as reads need them, with one flag byte per page in a
``.pages`` file beside it. Readers map the copy; a page is written (``pwrite``) before its
flag, and the kernel's page cache makes both visible to the node's other processes at
once, so workers share what any of them fetched. Two processes fetching one page write the
same bytes; one killed between the two writes leaves the flag unset, and the page is
fetched again. Every record read through the copy is still checked against the sample's
bytes (its checksum), so a page that went wrong fails its reads, never passes them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from shardex.errors import FormatError
from shardex.storage.base import Storage
from shardex.storage.cache import cached_path

#: Bytes per page: ~1,360 sample records or ~1,000 members rows. Opening and reading one
#: sample fetches at most four pages (each file's header page, a record's and its row's).
PAGE: Final = 32 << 10


class PagedCopy:
    """A local copy of ``storage``'s object ``name`` whose pages are fetched on demand."""

    def __init__(self, storage: Storage, name: str, fingerprint: str) -> None:
        self.storage, self.name = storage, name
        self.path = cached_path(storage, name, fingerprint).with_suffix(".paged")
        flags = self.path.with_suffix(".pages")
        first = None
        if not flags.is_file() or not self.path.is_file():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            first, size = storage.get_head(name, PAGE)  # the first page and the size: one GET
            _create(flags, -(-size // PAGE))  # the flags first: a copy always has them
            _create(self.path, size)
        self.size = self.path.stat().st_size
        self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        self._flags_fd = os.open(flags, os.O_RDWR | os.O_CLOEXEC)
        pages = -(-self.size // PAGE)
        self._flags = mmap.mmap(self._flags_fd, pages, access=mmap.ACCESS_READ) if pages else b""
        if first is not None and pages and not self._flags[0]:
            self.keep([0], [first])
        self.fetch([(0, min(self.size, 16))])
        self.data_start = _npy_data_start(os.pread(self._fd, 16, 0))
        self.fetch([(0, self.data_start)])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            os.close(self._fd)
            os.close(self._flags_fd)

    def fetch(self, spans: Iterable[tuple[int, int]]) -> None:
        """Make the bytes ``[start, stop)`` of each span local (one concurrent batch)."""
        fetch_pages([(self, spans)])

    def missing(self, spans: Iterable[tuple[int, int]]) -> list[int]:
        """The pages of ``spans`` not yet local."""
        flags, size = self._flags, self.size
        return sorted(
            {
                page
                for start, stop in spans
                for page in range(start // PAGE, -(-min(stop, size) // PAGE))
                if not flags[page]
            }
        )

    def keep(self, pages: list[int], datas: list[bytes]) -> None:
        """Write fetched ``pages``, then their flags."""
        for page, data in zip(pages, datas, strict=True):
            if len(data) != min(PAGE, self.size - page * PAGE):
                raise FormatError(
                    f"{self.storage.join(self.name)} is shorter than it was when opened "
                    "(replaced or damaged)"
                )
            os.pwrite(self._fd, data, page * PAGE)
        for page in pages:
            os.pwrite(self._flags_fd, b"\1", page)

    def span(self, lo: int, hi: int, width: int) -> tuple[int, int]:
        """The span of rows ``lo`` to ``hi`` (excluded) of ``width`` bytes."""
        return self.data_start + lo * width, self.data_start + hi * width

    def rows(self, numbers: Iterable[int], width: int) -> list[tuple[int, int]]:
        """The spans of rows ``numbers`` of ``width`` bytes after the header."""
        at = self.data_start
        return [(at + i * width, at + (i + 1) * width) for i in numbers]

    def whole(self) -> None:
        """Make the whole object local."""
        self.fetch([(0, self.size)])


def fetch_pages(wanted: Iterable[tuple[PagedCopy, Iterable[tuple[int, int]]]]) -> None:
    """The missing pages of each copy's spans, fetched as one concurrent batch (the copies
    are of one storage)."""
    todo = [(copy, copy.missing(spans)) for copy, spans in wanted]
    todo = [(copy, pages) for copy, pages in todo if pages]
    if not todo:
        return
    requests = [
        (copy.name, p * PAGE, min(PAGE, copy.size - p * PAGE))
        for copy, pages in todo
        for p in pages
    ]
    datas = todo[0][0].storage.get_range_batch(requests)
    at = 0
    for copy, pages in todo:
        copy.keep(pages, datas[at : at + len(pages)])
        at += len(pages)


def _create(path: Path, size: int) -> None:
    """A sparse file of ``size`` bytes at ``path``, unless another process made it first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.truncate(size)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _npy_data_start(head: bytes) -> int:
    """Where an ``.npy`` file's data starts, from its first 16 bytes (0: not an .npy file,
    left for the reader to refuse)."""
    if len(head) < 12 or head[:6] != b"\x93NUMPY":
        return 0
    if head[6] == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    return 12 + int.from_bytes(head[8:12], "little")
