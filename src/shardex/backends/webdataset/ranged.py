"""Shards on object storage: ``ds[i]`` is one ranged GET, iteration one GET a shard."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from xxhash import xxh3_64_intdigest as _xxh3

from shardex.backends.webdataset.access import Access, cut
from shardex.contract import SplitInfo
from shardex.dataset import ReopenedDataset, Sample
from shardex.errors import FormatError, ObjectNotFoundError
from shardex.format.mapped import ABSENT
from shardex.storage.paged import PagedCopy, fetch_pages


def _close(stream: object) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        close()


class _Window:
    """A shard's stream seen through its last chunk, ``window``: bytes [base, top)."""

    def __init__(self, chunks: Iterator[bytes], where: str) -> None:
        self.chunks, self.where = chunks, where
        self.window, self.view, self.base, self.top = b"", memoryview(b""), 0, 0

    def take(self, off: int, length: int) -> tuple[bytes, memoryview, int]:
        """(buffer, view, start) of a sample past the window: only its bytes are joined,
        and the last chunk becomes the window."""
        parts = [self.window[off - self.base :]]
        have = len(parts[0])
        while have < length:
            chunk = next(self.chunks, None)
            if chunk is None:
                raise FormatError(f"{self.where} is shorter than its index says")
            parts.append(chunk)
            have += len(chunk)
        window = self.window = parts[-1]
        base = self.base = off + have - len(window)
        view = self.view = memoryview(window)
        self.top = base + len(window)
        if base == off:
            return window, view, 0
        parts[-1] = window[: off + length - base]
        buf = b"".join(parts)
        return buf, memoryview(buf), 0


class Ranged(Access):
    """Shards read with ranged GETs, and streamed for iteration. The index files are read
    by pages as reads need them (:mod:`shardex.storage.paged`): opening a 10M-sample
    export and reading one sample fetches a few pages, not ~560 MB of index."""

    def __init__(self, ds: ReopenedDataset, info: SplitInfo) -> None:
        self._copies: dict[str, PagedCopy] = {}
        super().__init__(ds, info)
        self._records = self._copies[info.index.samples]  # type: ignore[union-attr]

    def _index_file(self, name: str) -> Path:
        copy = self._copies[name] = PagedCopy(self.storage, name, self._fingerprint)
        return copy.path

    def _want(self, numbers: Sequence[int]) -> None:
        self._pages(lambda copy, width: copy.rows(numbers, width))

    def _want_range(self, lo: int, hi: int) -> None:
        self._pages(lambda copy, width: [copy.span(lo, hi, width)])

    def _pages(self, spans: Callable[[PagedCopy, int], list[tuple[int, int]]]) -> None:
        """The records' and the members rows' ``spans`` made local, in one batch."""
        wanted = [(self._records, spans(self._records, 24))]
        if self.members is not None:
            rows = self._copies[self._members_file]  # type: ignore[index]
            wanted.append((rows, spans(rows, self._msize)))
        fetch_pages(wanted)

    def whole(self) -> None:
        if self._pending:
            self._load_members()
        for copy in self._copies.values():
            copy.whole()

    def iterate(self, read_chunk: int, stream_chunk: int) -> Iterator[Sample]:
        """Samples in shard order, holding one chunk of the stream (~1 MiB) and the
        shard's records and rows (~0.2 KB a sample)."""
        if self._pending:
            self._load_members()
        paths = self._paths
        streams = self.storage.iter_objects(paths, stream_chunk) if paths else iter([])
        try:
            for shard, path in enumerate(paths):
                chunks = next(streams)
                try:
                    first, end = self._first[shard], self._first[shard + 1]
                    self._want_range(first, end)
                    yield from self._samples_of_stream(shard, path, chunks, first, end)
                finally:
                    _close(chunks)
        finally:  # stopped early: the request sent ahead ends too
            _close(streams)

    def _samples_of_stream(
        self, shard: int, path: str, chunks: Iterator[bytes], first: int, end: int
    ) -> Iterator[Sample]:
        """Samples ``first .. end`` of a shard's stream, as ``Mapped`` iterates: fields
        sliced from the chunk's ``bytes`` (a view's slice + ``tobytes`` costs ~0.4 us
        more); a sample that fails a check goes the checked way."""
        stream = _Window(chunks, self.storage.join(path))
        window, view, base, top = stream.window, stream.view, stream.base, stream.top
        seed, verify, decode, inside = self.seed, self.verify, self.decode, self._inside
        # lists: a struct iterator kept alive by a traceback crashed the garbage collector
        records = list(self.index.records(first, end))
        members = self.members
        rows: list[tuple[int, ...]] = (
            list(members.unpacked(first, end))
            if members is not None
            else [(0, 0, ABSENT)] * len(records)
        )
        mraw, msize, columns = self._mraw, self._msize, self._columns
        checked = msize - 8
        at = first * msize + 8 - msize
        for number, (off, checksum, _, length), row in zip(
            range(first, end), records, rows, strict=True
        ):
            at += msize
            if off + length <= top:
                buf, data, start = window, view, off - base
            else:
                try:
                    buf, data, start = stream.take(off, length)
                except (ObjectNotFoundError, FormatError) as exc:  # the rest are lost
                    for lost in range(number, end):
                        self._skip(lost, exc)
                    return
                window, view, base, top = stream.window, stream.view, stream.base, stream.top
            if row[2] != ABSENT and (
                _xxh3(data[start : start + length], number * seed) == checksum
                and _xxh3(mraw[at : at + checked], checksum) == row[0]
                if verify
                else inside(row, length)
            ):
                yield cut(buf, start, row, columns, decode)
                continue
            try:
                sample = self._sample(buf[start : start + length], checksum, shard, off, number)
            except FormatError as exc:
                self._skip(number, exc)
                continue
            yield sample
