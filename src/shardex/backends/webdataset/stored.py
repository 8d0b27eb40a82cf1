"""A ``webdataset`` export read as a re-export's source: each sample read once and
checked, its members described as byte ranges of the tar, so memory stays bounded.

Remote shards are read in :data:`WINDOW`-byte ranged GETs; members name the object by
URL, or a kept local copy (:func:`shardex.storage.fetch.tars.copies_kept`). On Ray each
run of a shard's samples is read by a task that keeps the bytes in the object store
(:mod:`shardex.storage.fetch.held`). Either way each byte is fetched once.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from shardex.backends.base import StoredMember, StoredSample
from shardex.backends.webdataset.access import check_sample_bytes
from shardex.backends.webdataset.reader import ShardDataset
from shardex.errors import ChecksumError, FormatError, ShardexError
from shardex.format.tar import iter_members, split_name
from shardex.sources.base import KeepingRunner, MapRunner
from shardex.storage import Storage
from shardex.storage.fetch.held import HeldTars, Part, TarHold, held_tars
from shardex.storage.fetch.objects import register
from shardex.storage.fetch.tars import TarCopy, kept_copies

_RECORDS: Final = 1 << 16  # index records read at a time
#: Bytes per ranged GET of a remote shard (a window starts at a sample).
WINDOW: Final = 8 << 20


class _Unreadable(Exception):
    """A shard that cannot be read at all."""


class _LocalShard:
    def __init__(self, path: str, tar: str) -> None:
        self.path, self.tar = path, tar
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _Unreadable(f"cannot read {tar!r} ({exc.strerror})") from exc

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def where(self, offset: int, size: int) -> str:
        return self.path

    def close(self) -> None:
        os.close(self._fd)


class _ObjectShard:
    """A shard on object storage read in windows."""

    def __init__(
        self, storage: Storage, path: str, size: int, copy: TarCopy | TarHold | None
    ) -> None:
        self._storage, self._path, self._size = storage, path, size
        self.tar = storage.join(path)
        self._copy = copy
        self._buf = b""
        self._start = 0
        self._end: int | None = None  # set when a read came back short

    def read(self, offset: int, length: int) -> bytes:
        lo = offset - self._start
        if lo >= 0 and offset + length <= self._start + len(self._buf):
            return self._buf[lo : lo + length]
        if self._end is not None and offset >= self._end:
            return b""  # past a truncated object's end
        want = min(max(length, WINDOW), max(self._size - offset, length))
        try:
            data = self._storage.get_range(self._path, offset, want)
        except ShardexError as exc:
            raise _Unreadable(f"cannot read {self.tar!r} ({exc})") from exc
        if len(data) < want:
            self._end = offset + len(data)
        if self._copy is not None:
            self._copy.put(offset, data)
        self._buf, self._start = data, offset
        return data[:length]

    def where(self, offset: int, size: int) -> str:
        """Where the member's bytes are: the local copy when it holds them, else the object."""
        if isinstance(self._copy, TarCopy) and self._copy.holds(offset, size):
            self._copy.used = True
            return str(self._copy.path)
        return self.tar

    def close(self) -> None:
        self._buf = b""
        if self._copy is not None:
            self._copy.close()


def stored_samples(
    ds: ShardDataset, key: Callable[[int], str], runner: MapRunner | None = None
) -> Iterator[StoredSample]:
    """The split's samples in order, read here or by ``runner``'s Ray tasks."""
    if any(ds.storage.local_path(s.path) is None for s in ds.config.split(ds.split).shards):
        register(ds.storage)  # URLs fetched with the source's own options
        held = held_tars()
        if held is not None and isinstance(runner, KeepingRunner):
            return _samples_held(ds, key, runner, held)
    return _samples(ds, key)


def _open(ds: ShardDataset, shard: int) -> _LocalShard | _ObjectShard:
    info = ds.config.split(ds.split).shards[shard]
    tar = ds.storage.join(info.path)
    path = ds.storage.local_path(info.path)
    if path is not None:
        return _LocalShard(str(path), tar)
    copies = kept_copies()
    copy = copies.start(tar, info.num_bytes) if copies is not None else None
    return _ObjectShard(ds.storage, info.path, info.num_bytes, copy)


def _records(ds: ShardDataset) -> Iterator[tuple[int, int, int, int, int]]:
    """The index records (number, offset, checksum, shard, length), a block at a time."""
    records = ds.records
    for lo in range(0, len(records), _RECORDS):
        part = records[lo : lo + _RECORDS]
        columns = (part[name].tolist() for name in ("offset", "checksum", "shard", "length"))
        yield from zip(itertools.count(lo), *columns, strict=False)


def _samples(ds: ShardDataset, key: Callable[[int], str]) -> Iterator[StoredSample]:
    shards = ds.config.split(ds.split).shards
    current: tuple[int, _LocalShard | _ObjectShard | str] | None = None
    try:
        for number, offset, expected, shard, length in _records(ds):
            where = f"sample {number} ({key(number)!r})"
            if shard >= len(shards) or offset + length > shards[shard].num_bytes:
                yield StoredSample(
                    key(number), (), f"source {where}: its index entry is damaged (shardex verify)"
                )
                continue
            if current is None or current[0] != shard:
                if current is not None and not isinstance(current[1], str):
                    current[1].close()
                try:
                    current = (shard, _open(ds, shard))
                except _Unreadable as exc:  # its samples are lost
                    current = (shard, str(exc))
            check = ds.check_sample
            yield _sample(check, current[1], where, number, offset, length, expected, shard)
    finally:
        if current is not None and not isinstance(current[1], str):
            current[1].close()


#: ``(bytes, checksum, shard, offset, number)`` -> raises ChecksumError.
Check = Callable[[bytes, int, int, int, int], None]


def _sample(
    check: Check,
    reader: _LocalShard | _ObjectShard | str,
    where: str,
    number: int,
    offset: int,
    length: int,
    expected: int,
    shard: int,
) -> StoredSample:
    """Sample ``number`` read, checked and described as byte ranges."""
    if isinstance(reader, str):
        return StoredSample("", (), f"source {where}: {reader}")
    try:
        data = reader.read(offset, length)
    except _Unreadable as exc:
        return StoredSample("", (), f"source {where}: {exc}")
    if len(data) != length:
        return StoredSample(
            "", (), f"source {where} at byte {offset} of {reader.tar!r}: the shard is truncated"
        )
    try:
        check(data, expected, shard, offset, number)
    except ChecksumError as exc:
        return StoredSample("", (), f"source {where}: {exc}")
    try:
        found = list(iter_members(data, where=f"{reader.tar} at byte {offset}"))
    except FormatError as exc:
        return StoredSample("", (), f"source {where}: {exc}")
    names = {split_name(m.name)[0] for m in found}
    members = tuple(
        StoredMember(
            split_name(m.name)[1],
            reader.where(offset + m.data_offset, m.size),
            offset + m.data_offset,
            m.size,
        )
        for m in found
    )
    return StoredSample(names.pop() if len(names) == 1 else "", members)


#: What a task's scan ends with: the shard's URL, its samples by number, the parts' spans.
_Scanned = tuple[str, list[tuple[int, StoredSample]], list[tuple[int, int]]]
#: A sample's place in a task's messages (the driver knows its key).
_WHERE: Final = "\x00where\x00"


@dataclass(frozen=True, slots=True)
class _Run:
    """Consecutive samples of one remote shard for a task, and the damaged entries
    before them (handed back in order)."""

    storage: Storage
    path: str
    size: int
    shard: int
    seed: int
    records: npt.NDArray[np.uint64]  # rows: number, offset, length, checksum
    before: tuple[tuple[int, StoredSample], ...] = ()


def _samples_held(
    ds: ShardDataset, key: Callable[[int], str], runner: KeepingRunner, held: HeldTars
) -> Iterator[StoredSample]:
    """:func:`_samples` with each run read by a task (:func:`_scan_run`) into ``held``."""
    for result, parts in runner.imap_kept(_scan_run, _runs(ds)):
        url, samples, spans = cast(_Scanned, result)  # what _scan_run yields last
        held.add(url, parts, spans)
        for number, sample in samples:
            if sample.invalid is not None and _WHERE in sample.invalid:
                where = f"sample {number} ({key(number)!r})"
                sample = StoredSample(
                    sample.key, sample.members, sample.invalid.replace(_WHERE, where)
                )
            yield sample


def _runs(ds: ShardDataset) -> Iterator[_Run]:
    """The records as runs of one shard each (damaged entries go with the next run)."""
    shards = ds.config.split(ds.split).shards
    bad: list[tuple[int, StoredSample]] = []
    run: list[tuple[int, int, int, int]] = []
    shard_of_run = -1

    def cut() -> _Run:
        path, size = (shards[shard_of_run].path, shards[shard_of_run].num_bytes) if run else ("", 0)
        rows = np.array(run, np.uint64).reshape(-1, 4)  # checksums are unsigned
        out = _Run(ds.storage, path, size, shard_of_run, ds.seed, rows, tuple(bad))
        bad.clear()
        run.clear()
        return out

    for number, offset, checksum, shard, length in _records(ds):
        if shard >= len(shards) or offset + length > shards[shard].num_bytes:
            why = f"source {_WHERE}: its index entry is damaged (shardex verify)"
            bad.append((number, StoredSample("", (), why)))
            continue
        if run and shard != shard_of_run:
            yield cut()
        shard_of_run = shard
        run.append((number, offset, length, checksum))
    if run or bad:
        yield cut()


def _scan_run(run: _Run) -> Iterator[Part | _Scanned]:
    """In a task: a run's samples read as :func:`_sample` reads them, their members'
    bytes kept in parts (yielded as they fill); last, the URL, samples and spans."""
    hold = TarHold()
    url = run.storage.join(run.path)
    samples = list(run.before)

    def check(data: bytes, expected: int, shard: int, offset: int, number: int) -> None:
        check_sample_bytes(data, expected, run.seed, number, offset, url)

    if len(run.records):
        reader = _ObjectShard(run.storage, run.path, run.size, hold)
        for number, offset, length, expected in run.records.tolist():
            sample = _sample(check, reader, _WHERE, number, offset, length, expected, run.shard)
            # labels and metadata come from metadata.parquet
            kept = [m for m in sample.members if m.ext not in ("cls", "json")]
            hold.take((m.ext, m.offset, m.size, None) for m in kept)
            samples.append((number, sample))
            for part in hold.ready():
                yield part
        reader.close()
    for part in hold.finish():
        yield part
    yield url, samples, hold.spans
