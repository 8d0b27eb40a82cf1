"""What every way of reading a split's tar shards shares (:class:`Access`): the index,
the checked read of a sample, ranged batches, and telling an overwrite from damage."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, cast

from xxhash import xxh3_64_intdigest as _xxh3

from shardex.codecs.fields import decode_fields
from shardex.contract import CONFIG_FILE, ExportConfig, SplitInfo
from shardex.dataset import ReopenedDataset, Sample
from shardex.errors import (
    ChecksumError,
    ExportReplacedError,
    FormatError,
    ObjectNotFoundError,
    ShardexError,
)
from shardex.format.mapped import ABSENT, RECORD, MemberIndex, SplitIndex, checksum_seeds
from shardex.format.tar import parse_sample
from shardex.storage.cache import local_copy

if TYPE_CHECKING:  # numpy loads on first use: opening and reads need none
    import concurrent.futures
    import mmap
    from pathlib import Path


# The pid, kept current by a fork hook: os.getpid() is too dear for every read.
PROCESS = [os.getpid()]

# Threads that read a dataset's first samples at once load its index-members.npy once.
_LOADING = [threading.Lock()]


def _after_fork() -> None:
    PROCESS[0] = os.getpid()
    _LOADING[0] = threading.Lock()  # a fork while another thread held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def check_sample_bytes(
    buf: bytes | memoryview, checksum: int, seed: int, number: int, offset: int, tar: str
) -> None:
    """Raise ChecksumError unless ``buf`` is sample ``number`` as exported."""
    if _xxh3(buf, number * seed) != checksum:
        raise ChecksumError(
            f"checksum mismatch for sample {number} at byte {offset} of {tar}: the bytes "
            f"there are not sample {number} as exported (the shard or its index record is "
            "damaged)"
        )


def cut(
    buf: bytes | mmap.mmap,
    start: int,
    row: tuple[int, ...],
    columns: list[tuple[str, int]],
    decode: bool,
) -> Sample:
    """The sample at ``buf[start:]`` sliced by its index-members ``row`` (no header parsed)."""
    sample: Sample = {}
    for name, j in columns:
        size = row[j + 1]
        if size != ABSENT:
            begin = start + row[j]
            sample[name] = buf[begin : begin + size]
    if decode:
        sample = decode_fields(sample)
    key_at = start + row[1]
    sample["__key__"] = buf[key_at : key_at + row[2]].decode("utf-8", "replace")
    return sample


def parsed(buf: bytes, where: str, start: int, stop: int | None, decode: bool) -> Sample:
    """The sample at ``buf[start:stop]`` parsed from its tar headers."""
    key, fields = parse_sample(buf, where=where, start=start, stop=stop)
    sample = decode_fields(fields) if decode else cast(Sample, fields)
    sample["__key__"] = key
    return sample


class Access:
    """A split's samples read the checked way: bounded by config.yaml's shard sizes,
    checked, then sliced by members row or parsed. Subclasses add fast paths."""

    def __init__(self, ds: ReopenedDataset, info: SplitInfo) -> None:
        # settings copied, no reference kept: dropping the dataset closes the shards
        storage, self.config, self.split = ds.storage, ds.config, ds.split
        self.storage, self.verify, self.decode = storage, ds.verify, ds.decode
        self.on_error, self.skipped = ds.on_error, ds.skipped
        assert info.index is not None  # the dataset checked
        # remote index copies are keyed by the shards' checksums: never a stale index
        fp = self._fingerprint = "\n".join(s.checksum for s in info.shards)
        keys = info.index.keys
        self.index = SplitIndex(
            self._index_file(info.index.samples),
            lambda: local_copy(storage, keys, fp),
            num_samples=info.num_samples,
        )
        self._paths = [s.path for s in info.shards]
        self._sizes = [s.num_bytes for s in info.shards]
        self._first = list(accumulate((s.num_samples for s in info.shards), initial=0))
        self._n = info.num_samples
        self._unpack, self._raw = RECORD.unpack_from, self.index.raw
        #: index-members.npy (format 3), loaded by the first read: opening costs no request.
        self.members: MemberIndex | None = None
        self._members_file = info.index.members
        self._pending = info.index.members is not None
        #: (extension, position of its offset in an unpacked row; its size follows)
        self._columns: list[tuple[str, int]] = []
        self._mraw, self._msize = memoryview(b""), 0
        self._munpack: Callable[[memoryview, int], tuple[int, ...]] | None = None
        # checksums are seeded with number * seed (format 1: unseeded)
        self.seed = 1 if checksum_seeds(self.config.format_version) else 0
        self._same_config: bytes | None = None

    def _index_file(self, name: str) -> Path:
        """A local file for the index file ``name``: itself, or a copy (see Ranged)."""
        return local_copy(self.storage, name, self._fingerprint)

    def whole(self) -> None:
        """Make the whole index local (Ranged reads it by pages)."""

    def _want(self, numbers: Sequence[int]) -> None:
        """Make the index records and rows of samples ``numbers`` local (Ranged)."""

    def _load_members(self) -> None:
        """Map index-members.npy (remote: fetched once into the cache)."""
        assert self._members_file is not None  # pending only when config.yaml names one
        with _LOADING[0]:
            if not self._pending:
                return
            try:
                m = MemberIndex(self._index_file(self._members_file), num_samples=self._n)
            except (FormatError, ObjectNotFoundError) as exc:
                self.check_replaced(exc)
                raise
            self._mraw, self._msize = m.raw, m.row_size
            self._columns = [(name, 3 + 2 * k) for k, name in enumerate(m.names)]
            self._munpack, self.members, self._pending = m.unpack, m, False

    def check_replaced(self, exc: ShardexError) -> None:
        """Raise ExportReplacedError from ``exc`` when config.yaml changed since opening:
        then a missing file or bad bytes mean an overwrite, not damage."""
        try:
            text = self.storage.get(CONFIG_FILE)
            if text == self._same_config:
                return
            where = self.storage.join(CONFIG_FILE)
            changed = ExportConfig.from_yaml(text, where=where) != self.config
        except ShardexError:  # config.yaml gone or unreadable: not the export we opened
            changed = True
        if changed:
            raise ExportReplacedError(
                f"export at {self.storage.uri} was replaced since it was opened; reopen it "
                f"(the read failed with: {exc})"
            ) from exc
        # skipping many damaged samples re-reads config.yaml, but never re-parses it
        self._same_config = text

    def _read(self, shard: int, offset: int, length: int) -> bytes:
        # checked on every read: a damaged index cannot make a read leave its shard
        if shard >= len(self._sizes):
            raise FormatError(
                f"index entry names shard {shard} but split {self.split!r} has "
                f"{len(self._sizes)} shards: the index is damaged"
            )
        if offset + length > self._sizes[shard]:
            raise FormatError(
                f"index entry points past the end of {self.storage.join(self._paths[shard])} "
                f"({offset}+{length} > {self._sizes[shard]} bytes)"
            )
        data = self._fetch(shard, offset, length)
        if len(data) != length:
            raise FormatError(
                f"{self.storage.join(self._paths[shard])} is shorter than its index says "
                "(truncated?)"
            )
        return data

    def _fetch(self, shard: int, offset: int, length: int) -> bytes:
        return self.storage.get_range(self._paths[shard], offset, length)

    def check_sample(
        self, buf: bytes | memoryview, checksum: int, shard: int, offset: int, number: int
    ) -> None:
        """Raise ChecksumError unless ``buf`` is sample ``number`` as exported."""
        where = self.storage.join(self._paths[shard])
        check_sample_bytes(buf, checksum, self.seed, number, offset, where)

    def from_bytes(
        self, data: bytes, checksum: int, shard: int, offset: int, number: int
    ) -> Sample:
        if self._pending:
            self._load_members()
        return self._sample(data, checksum, shard, offset, number)

    def _cut(
        self, buf: bytes | mmap.mmap, start: int, number: int, checksum: int, stop: int
    ) -> Sample | None:
        """Sample ``number`` sliced out of its checked bytes by its members row; None
        when the row fails its check (seeded with the sample's checksum), says to parse,
        or points outside the sample: the caller then goes the checked way."""
        at = number * self._msize
        row = self._munpack(self._mraw, at)  # type: ignore[misc]  # set with members
        if self.verify:
            if _xxh3(self._mraw[at + 8 : at + self._msize], checksum) != row[0]:
                return None
        elif not self._inside(row, stop - start):
            return None
        if row[2] == ABSENT:
            return None
        return cut(buf, start, row, self._columns, self.decode)

    def _inside(self, row: tuple[int, ...], length: int) -> bool:
        """Whether an unchecked row stays inside the sample (not slicing other bytes)."""
        if row[2] != ABSENT and row[1] + row[2] > length:
            return False
        for _, j in self._columns:  # a loop: all() over a generator cost ~0.4 us a sample
            size = row[j + 1]
            if size != ABSENT and row[j] + size > length:
                return False
        return True

    def _fields(
        self, buf: bytes, start: int, stop: int, shard: int, number: int, checksum: int
    ) -> Sample:
        """Sample ``number`` from its checked bytes: sliced by its row, or parsed.

        Raises:
            FormatError: the row is damaged, or the tar headers are.
        """
        if self.members is not None:
            sample = self._cut(buf, start, number, checksum, stop)
            if sample is not None:
                return sample
            at = number * self._msize
            row = self._munpack(self._mraw, at)  # type: ignore[misc]  # set with members
            if _xxh3(self._mraw[at + 8 : at + self._msize], checksum) != row[0]:
                raise FormatError(
                    f"row {number} of {self.storage.join(self._members_file or '')} fails its "
                    "check: the file is damaged, or was not written for these samples; "
                    "`shardex verify` reports it, a re-export repairs it"
                )
        return parsed(buf, self._paths[shard], start, stop, self.decode)

    def _sample(self, buf: bytes, checksum: int, shard: int, offset: int, number: int) -> Sample:
        if self.verify and _xxh3(buf, number * self.seed) != checksum:
            self.check_sample(buf, checksum, shard, offset, number)
        return self._fields(buf, 0, len(buf), shard, number, checksum)

    def _number(self, index: int) -> int:
        """``index`` counted from the end, or IndexError (off the hot path)."""
        n = self._n
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample {index} is out of range for a split of {n} samples")
        return index

    def get(self, index: int) -> Sample:
        if not 0 <= index < self._n:
            index = self._number(index)
        if self._pending:
            self._load_members()
        self._want((index,))
        return self._checked(index, *self._unpack(self._raw, index * 24))

    def _checked(self, index: int, offset: int, checksum: int, shard: int, length: int) -> Sample:
        """Sample ``index`` read the checked way, which raises the error that fits."""
        try:
            return self._sample(self._read(shard, offset, length), checksum, shard, offset, index)
        except (FormatError, ObjectNotFoundError) as exc:
            self.check_replaced(exc)
            raise

    def get_many(self, indices: Sequence[int], gap: int) -> list[Sample]:
        """Samples in the order asked, read in per-shard blocks merged across ``gap``."""
        return self.start_many(indices, gap)()

    def start_many(self, indices: Sequence[int], gap: int) -> Callable[[], list[Sample]]:
        """:meth:`get_many` with its reads sent now; calling the result waits for them."""
        if self._pending:
            self._load_members()
        import numpy as np  # here: a batch from object storage sorts its reads with it

        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return list
        idx = np.where(idx < 0, idx + self._n, idx)
        if idx.min() < 0 or idx.max() >= self._n:
            raise IndexError(f"indices out of range for a split of {self._n} samples")
        self._want(idx.tolist())
        rec = self.index.samples[idx]
        order = np.lexsort((rec["offset"], rec["shard"]))
        shards, offs = rec["shard"][order].tolist(), rec["offset"][order].tolist()
        lens, sums = rec["length"][order].tolist(), rec["checksum"][order].tolist()
        blocks: list[tuple[int, int, int, int]] = []  # shard, start, length, first..last
        i = 0
        while i < len(order):
            j, end = i + 1, offs[i] + lens[i]
            while j < len(order) and shards[j] == shards[i] and offs[j] - end <= gap:
                end = max(end, offs[j] + lens[j])
                j += 1
            blocks.append((shards[i], offs[i], end - offs[i], j))
            i = j
        pos, numbers = order.tolist(), idx[order].tolist()
        try:
            reads = self._send_blocks([(b[0], b[1], b[2]) for b in blocks])
        except (FormatError, ObjectNotFoundError) as exc:
            self.check_replaced(exc)
            raise

        def finish() -> list[Sample]:
            out: list[Sample | None] = [None] * len(pos)
            first = 0
            try:
                datas = self._received(blocks, reads.result())
                for (shard, start, _length, stop), data in zip(blocks, datas, strict=True):
                    for k in range(first, stop):
                        at = offs[k] - start
                        out[pos[k]] = self._sample(
                            data[at : at + lens[k]], sums[k], shard, offs[k], numbers[k]
                        )
                    first = stop
            except (FormatError, ObjectNotFoundError) as exc:
                self.check_replaced(exc)
                raise
            return out  # type: ignore[return-value]

        return finish

    def _send_blocks(
        self, blocks: list[tuple[int, int, int]]
    ) -> concurrent.futures.Future[list[bytes]]:
        """(shard, offset, length) blocks sent as one concurrent batch of ranged GETs."""
        for shard, off, n in blocks:
            if off + n > self._sizes[shard]:
                self._read(shard, off, n)  # raises the out-of-shard error
        return self.storage.submit_range_batch([(self._paths[s], o, n) for s, o, n in blocks])

    def _received(self, blocks: list[tuple[int, int, int, int]], datas: list[bytes]) -> list[bytes]:
        for (shard, _off, n, _stop), data in zip(blocks, datas, strict=True):
            if len(data) != n:
                raise FormatError(
                    f"{self.storage.join(self._paths[shard])} is shorter than "
                    "its index says (truncated?)"
                )
        return datas

    def iterate(self, read_chunk: int, stream_chunk: int) -> Iterator[Sample]:
        raise NotImplementedError  # each way iterates its own way

    def _read_checked(
        self, shard: int, off: int, length: int, checksum: int, number: int
    ) -> Sample | None:
        """A sample read the checked way; None when damaged and skipped."""
        try:
            return self._sample(self._read(shard, off, length), checksum, shard, off, number)
        except FormatError as exc:
            self._skip(number, exc)
            return None

    def _skip(self, number: int, exc: FormatError | ObjectNotFoundError) -> None:
        """Raise, or record and log a damaged sample (never a replaced export)."""
        self.check_replaced(exc)
        if self.on_error != "skip":
            raise exc
        self.skipped.append((number, str(exc)))
        import logging  # here: ~4 ms to import, and only a skipped sample logs

        log = logging.getLogger("shardex.backends.webdataset.reader")
        log.warning("skipped damaged sample %d of split %r: %s", number, self.split, exc)
