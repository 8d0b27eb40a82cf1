"""Reading a split of tar shards through its index: one ``pread`` (or ranged GET) per sample."""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from itertools import accumulate
from typing import TYPE_CHECKING, cast

from xxhash import xxh3_64_intdigest as _xxh3

from shardex.codecs.fields import decode_fields
from shardex.contract import CONFIG_FILE, ExportConfig, SplitInfo
from shardex.dataset import Sample, SampleRanges
from shardex.errors import (
    ChecksumError,
    ExportReplacedError,
    FormatError,
    ObjectNotFoundError,
    SampleNotFoundError,
    ShardexError,
    StorageError,
)
from shardex.format.mapped import (
    ABSENT,
    RECORD,
    MemberIndex,
    SplitIndex,
    checksum_seeds,
    key_hash,
)
from shardex.format.tar import iter_members, parse_sample, split_name
from shardex.storage.cache import local_copy

if TYPE_CHECKING:  # pyarrow and numpy load on first use: opening and reads need neither
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

_pread = os.pread

# The process id, kept current by a fork hook: os.getpid() is a system call, too dear for
# every read, and descriptors opened before a fork must not be shared with the child.
_PROCESS = [os.getpid()]


# Threads that read a dataset's first samples at once load its index-members.npy once.
_LOADING = [threading.Lock()]


def _after_fork() -> None:
    _PROCESS[0] = os.getpid()
    _LOADING[0] = threading.Lock()  # a fork while another thread held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

#: get_many merges two reads of one local shard when the gap between them is at most
#: this (object storage: its ``coalesce_gap`` option).
DEFAULT_COALESCE_GAP = 0


def _close_descriptors(fds: list[int | None], owner: list[int]) -> None:
    if os.getpid() != owner[0]:
        return  # forked: the parent's descriptors are the parent's to close
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def check_sample_bytes(
    buf: bytes | memoryview, checksum: int, seed: int, number: int, offset: int, tar: str
) -> None:
    """Raise ChecksumError unless ``buf``, read at ``offset`` of the shard ``tar``, is
    sample ``number`` as exported (``checksum``: its index record's; ``seed``: see
    :attr:`ShardDataset.seed`)."""
    if _xxh3(buf, number * seed) != checksum:
        raise ChecksumError(
            f"checksum mismatch for sample {number} at byte {offset} of {tar}: the bytes "
            f"there are not sample {number} as exported (the shard or its index record is "
            "damaged)"
        )


class ShardDataset(SampleRanges):
    """A split of a tar-shard export (the ``webdataset`` backend)."""

    #: Bytes per chunk when remote shards are streamed for iteration.
    stream_chunk_size = 4 << 20
    #: Bytes per read when local shards are iterated: large enough that a system call
    #: serves many samples, small enough to stay in the CPU cache while they are parsed.
    read_chunk_size = 1 << 20

    def _open_split(self, info: SplitInfo) -> None:
        storage, config, split = self.storage, self.config, self.split
        self._paths = [s.path for s in info.shards]
        self._sizes = [s.num_bytes for s in info.shards]
        self._first = list(accumulate((s.num_samples for s in info.shards), initial=0))
        if info.index is None:
            raise FormatError(f"split {split!r} of {storage.uri} has no index")
        # Cached copies of remote index files are keyed by the shards' checksums, so a
        # rewritten export never meets a stale index.
        fp = "\n".join(s.checksum for s in info.shards)
        keys = self._keys_file = info.index.keys
        self.index = SplitIndex(
            local_copy(storage, info.index.samples, fp),
            lambda: local_copy(storage, keys, fp),
            num_samples=info.num_samples,
        )
        self._n = info.num_samples
        #: Where each sample's members lie (format version 3): reads slice the fields
        #: out of the sample's bytes instead of parsing its tar headers. Loaded by the
        #: first read, so that opening costs no request for it.
        self.members: MemberIndex | None = None
        self._members_file, self._fingerprint = info.index.members, fp
        self._pending = info.index.members is not None
        self._members_where = storage.join(info.index.members or "")
        self._names: tuple[str, ...] = ()
        #: (extension, position of its offset in an unpacked row; its size follows)
        self._columns: list[tuple[str, int]] = []
        self._mraw, self._msize = memoryview(b""), 0
        self._munpack: Callable[[memoryview, int], tuple[int, ...]] | None = None
        self._record = self.index.record
        self._unpack, self._raw = RECORD.unpack_from, self.index.raw
        self._local = [storage.local_path(p) for p in self._paths]
        self._fds: list[int | None] = [None] * len(self._paths)
        # The shard descriptors are plain ints: nothing else closes them, so every dataset
        # dropped kept one per shard it had read (a loop opening datasets ran out of
        # descriptors). Closed when the reader goes or at exit (not in a __del__: at
        # interpreter shutdown it finds the module globals gone); a pickled copy reopens
        # its own (ReopenedDataset), a forked one leaves the parent's alone.
        self._owner = [os.getpid()]  # the process whose descriptors _fds holds
        weakref.finalize(self, _close_descriptors, self._fds, self._owner)
        #: Each open local shard mapped (format 3 reads slice their fields out of it: no
        #: system call and one copy per field), or None (see _map).
        self._maps: list[mmap.mmap | None] = [None] * len(self._paths)
        self._views: list[memoryview | None] = [None] * len(self._paths)
        self._count = len(self._paths)
        self._all_local = all(p is not None for p in self._local)
        self._pid = _PROCESS[0]
        # Format 2 seeds each sample's checksum with its number (0 x number: format 1).
        self._seed = 1 if checksum_seeds(config.format_version) else 0
        self._same_config: bytes | None = None

    def __len__(self) -> int:
        return self._n

    def _load_members(self) -> None:
        """Map index-members.npy (on object storage: fetch it once, into the cache)."""
        with _LOADING[0]:
            if self._pending:
                self._load_members_now()

    def _load_members_now(self) -> None:
        assert self._members_file is not None  # pending only when config.yaml names one
        try:
            path = local_copy(self.storage, self._members_file, self._fingerprint)
            m = MemberIndex(path, num_samples=self._n)
        except (FormatError, ObjectNotFoundError) as exc:
            self._check_replaced(exc)
            raise
        self._names, self._mraw, self._msize = m.names, m.raw, m.row_size
        self._columns = [(name, 3 + 2 * k) for k, name in enumerate(m.names)]
        self._munpack, self.members, self._pending = m.unpack, m, False

    def _open(self, shard: int) -> int | None:
        """The descriptor of a local shard (opened once per process); None if remote."""
        if self._pid != _PROCESS[0]:  # forked: descriptors are per process
            self._fds[:] = [None] * len(self._paths)
            self._pid = self._owner[0] = _PROCESS[0]
            self._maps, self._views = [None] * len(self._paths), [None] * len(self._paths)
        local = self._local[shard]
        if local is None:
            return None
        fd = self._fds[shard]
        if fd is None:
            try:
                fd = self._fds[shard] = os.open(local, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise ObjectNotFoundError(
                    f"shard {self.storage.join(self._paths[shard])} of split {self.split!r} "
                    "does not exist (deleted since the export was written?); "
                    "`shardex verify` lists what is missing"
                ) from exc
            except OSError as exc:
                raise StorageError(
                    f"cannot open shard {self.storage.join(self._paths[shard])}: {exc.strerror}"
                ) from exc
            self._map(shard, fd)
        return fd

    def _map(self, shard: int, fd: int) -> None:
        """Map an opened shard for the reads that slice fields (format 3), when it holds
        at least the bytes config.yaml lists: a shorter one is read with ``pread``, which
        raises the error that names it. shardex never changes a written file in place
        (writes go to a temporary name, then rename), so a mapping stays valid after an
        overwrite; a shard truncated in place by something else while mapped ends the
        process with SIGBUS, as a mapped index file always could."""
        size = self._sizes[shard]
        if (not self._pending and self._munpack is None) or size == 0:
            return  # no index-members.npy: samples are parsed from a pread's bytes
        try:
            if os.fstat(fd).st_size < size:
                return
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # out of mappings, or an odd file: pread serves
            return
        self._maps[shard], self._views[shard] = mapped, memoryview(mapped)

    def _check_replaced(self, exc: ShardexError) -> None:
        """Raise ExportReplacedError (from ``exc``) when config.yaml changed since the
        dataset was opened: a missing file or bytes that fail their checksum then mean an
        overwrite or append replaced the files this dataset reads, not damage."""
        try:
            changed = self._config_changed()
        except ShardexError:  # config.yaml gone or unreadable: not the export we opened
            changed = True
        if changed:
            raise ExportReplacedError(
                f"export at {self.storage.uri} was replaced since it was opened; reopen it "
                f"(the read failed with: {exc})"
            ) from exc

    def _config_changed(self) -> bool:
        text = self.storage.get(CONFIG_FILE)
        if text == self._same_config:  # seen before, and it was the opened config
            return False
        if ExportConfig.from_yaml(text, where=self.storage.join(CONFIG_FILE)) != self.config:
            return True
        # Remembered so that skipping many damaged samples re-reads, but never re-parses.
        self._same_config = text
        return False

    def _read(self, shard: int, offset: int, length: int) -> bytes:
        # The index is checked against the shard sizes of config.yaml on every read, so
        # a damaged index cannot make a read leave its shard.
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
        fd = self._fds[shard] if self._pid == _PROCESS[0] else None
        if fd is None:
            fd = self._open(shard)
        if fd is None:
            data = self.storage.get_range(self._paths[shard], offset, length)
        else:
            data = os.pread(fd, length, offset)
        if len(data) != length:
            raise FormatError(
                f"{self.storage.join(self._paths[shard])} is shorter than its index says "
                "(truncated?)"
            )
        return data

    def check_sample(
        self, buf: bytes | memoryview, checksum: int, shard: int, offset: int, number: int
    ) -> None:
        """Raise ChecksumError unless ``buf`` is sample ``number`` as exported (read at
        ``offset`` of shard number ``shard``; ``checksum`` is its index record's)."""
        check_sample_bytes(
            buf, checksum, self._seed, number, offset, self.storage.join(self._paths[shard])
        )

    @property
    def seed(self) -> int:
        """What a sample's number is multiplied by to seed its checksum (0: format 1)."""
        return self._seed

    @property
    def records(self) -> npt.NDArray[np.void]:
        return self.index.samples

    def from_bytes(
        self, data: bytes, checksum: int, shard: int, offset: int, number: int
    ) -> Sample:
        if self._pending:
            self._load_members()
        if self.verify:
            self.check_sample(data, checksum, shard, offset, number)
        return self._fields(data, 0, len(data), shard, number, checksum)

    def field_spans(self, data: bytes, shard: int) -> tuple[tuple[str, int, int], ...]:
        where = self._paths[shard]
        return tuple(
            (split_name(m.name)[1], m.data_offset, m.size) for m in iter_members(data, where=where)
        )

    def _cut(
        self, buf: bytes | mmap.mmap, start: int, number: int, checksum: int, stop: int
    ) -> Sample | None:
        """Sample ``number`` sliced out of ``buf[start:stop]`` (its bytes, already
        checked against ``checksum``, its record's) by its row of ``index-members.npy``;
        None when the row fails its check, says to parse, or (unverified) points outside
        the sample: the caller goes the checked way. With ``verify`` the row is checked
        first: its check is seeded with the sample's checksum, so only the row written for
        these very bytes passes."""
        at = number * self._msize
        row = self._munpack(self._mraw, at)  # type: ignore[misc]  # set with members
        if self.verify:
            if _xxh3(self._mraw[at + 8 : at + self._msize], checksum) != row[0]:
                return None
        elif not self._inside(row, stop - start):
            return None
        key_len = row[2]
        if key_len == ABSENT:
            return None
        sample: Sample = {}
        for name, j in self._columns:
            size = row[j + 1]
            if size != ABSENT:
                off = start + row[j]
                sample[name] = buf[off : off + size]
        if self.decode:
            sample = decode_fields(sample)
        key_at = start + row[1]
        sample["__key__"] = buf[key_at : key_at + key_len].decode("utf-8", "replace")
        return sample

    def _inside(self, row: tuple[int, ...], length: int) -> bool:
        """Whether an unchecked row's key and fields lie inside a sample of ``length``
        bytes (verify=False: a damaged row must not slice the shard's other bytes)."""
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
        """Sample ``number`` out of ``buf[start:stop]`` (its checked bytes): sliced by its
        index-members row, or parsed from its tar headers (exports before format 3, a row
        that says to parse).

        Raises:
            FormatError: the row is damaged, or the tar headers are.
        """
        if self.members is not None:
            sample = self._cut(buf, start, number, checksum, stop)
            if sample is not None:
                return sample
            self._check_row(number, checksum)
        where = self._paths[shard]
        key, fields = parse_sample(buf, where=where, start=start, stop=stop)
        sample = decode_fields(fields) if self.decode else cast(Sample, fields)
        sample["__key__"] = key
        return sample

    def _check_row(self, number: int, checksum: int) -> None:
        """Raise FormatError if sample ``number``'s row of index-members.npy fails its check
        (``checksum``: the sample's, which seeds it)."""
        at, size = number * self._msize, self._msize
        assert self._munpack is not None  # called with members only
        if _xxh3(self._mraw[at + 8 : at + size], checksum) != self._munpack(self._mraw, at)[0]:
            raise FormatError(
                f"row {number} of {self._members_where} fails its check: the file is "
                "damaged, or was not written for these samples; `shardex verify` reports "
                "it, a re-export repairs it"
            )

    def _sample(self, buf: bytes, checksum: int, shard: int, offset: int, number: int) -> Sample:
        if self.verify and _xxh3(buf, number * self._seed) != checksum:
            self.check_sample(buf, checksum, shard, offset, number)
        return self._fields(buf, 0, len(buf), shard, number, checksum)

    def _sample_in(
        self,
        buf: bytes,
        start: int,
        length: int,
        checksum: int,
        shard: int,
        offset: int,
        number: int,
    ) -> Sample:
        """``_sample`` of the sample at ``buf[start:start + length]``, without copying it
        out first where a members row slices its fields."""
        if self.members is None:
            return self._sample(buf[start : start + length], checksum, shard, offset, number)
        if self.verify:
            with memoryview(buf) as view, view[start : start + length] as data:
                if _xxh3(data, number * self._seed) != checksum:
                    self.check_sample(data, checksum, shard, offset, number)
        return self._fields(buf, start, start + length, shard, number, checksum)

    def _fast(
        self, number: int, offset: int, checksum: int, shard: int, length: int
    ) -> Sample | None:
        """Sample ``number`` read the short way, or None: an open local shard, a record
        inside it, a whole read, a matching checksum and a good members row (or plain
        members); anything else goes the checked way (``_read``, ``_sample``), which
        raises the error that fits."""
        if self._pid != _PROCESS[0] or shard >= self._count:
            return None
        fd = self._fds[shard]
        if fd is None or offset + length > self._sizes[shard]:
            return None
        buf = _pread(fd, length, offset)
        if len(buf) != length or (self.verify and _xxh3(buf, number * self._seed) != checksum):
            return None
        if self._munpack is not None:
            return self._cut(buf, 0, number, checksum, length)
        try:
            key, fields = parse_sample(buf, where=self._paths[shard])
        except FormatError:
            return None
        sample = decode_fields(fields) if self.decode else cast(Sample, fields)
        sample["__key__"] = key
        return sample

    def __getitem__(self, index: int) -> Sample:
        n = self._n
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample {index} is out of range for a split of {n} samples")
        if self._pending:
            self._load_members()
        offset, checksum, shard, length = self._unpack(self._raw, index * 24)
        if self._munpack is None:
            sample = self._fast(index, offset, checksum, shard, length)
            if sample is not None:
                return sample
        elif self._pid == _PROCESS[0] and shard < self._count:
            view = self._views[shard]
            stop = offset + length
            if view is not None and stop <= self._sizes[shard]:
                # Format 3, a mapped shard: the sample checked in place and its fields
                # sliced out of the mapping (no system call, one copy per field). This is
                # _cut inlined: the call and its attribute loads cost ~0.25 us a sample.
                at = index * self._msize
                row = self._munpack(self._mraw, at)
                key_len = row[2]
                if key_len != ABSENT and (
                    _xxh3(view[offset:stop], index * self._seed) == checksum
                    and _xxh3(self._mraw[at + 8 : at + self._msize], checksum) == row[0]
                    if self.verify
                    else self._inside(row, length)
                ):
                    mapped = self._maps[shard]
                    sample = {}
                    for name, j in self._columns:
                        size = row[j + 1]
                        if size != ABSENT:
                            begin = offset + row[j]
                            sample[name] = mapped[begin : begin + size]
                    if self.decode:
                        sample = decode_fields(sample)
                    key_at = offset + row[1]
                    key = mapped[key_at : key_at + key_len]
                    sample["__key__"] = key.decode("utf-8", "replace")
                    return sample
            elif self._fds[shard] is None and self._local[shard] is not None:
                try:
                    self._open(shard)  # first read of this shard: map it, then read
                except ShardexError:
                    pass  # the checked way below raises it
                else:
                    return self[index]
        try:
            return self._sample(self._read(shard, offset, length), checksum, shard, offset, index)
        except (FormatError, ObjectNotFoundError) as exc:
            self._check_replaced(exc)
            raise

    def get(self, key: str) -> Sample:
        """The sample with this key.

        Raises:
            SampleNotFoundError: no sample has it.
            FormatError: the key table is damaged (an entry names a sample of another key
                hash, or the hashes are out of order), so the answer cannot be trusted.
        """
        try:
            return self._get(key)
        except (ObjectNotFoundError, FormatError, SampleNotFoundError) as exc:
            # the key table is read lazily by name: after an overwrite it may be gone, or
            # another export's (second names alternate), so an answer waits on the config
            self._check_replaced(exc)
            raise

    def _get(self, key: str) -> Sample:
        h = key_hash(key)
        keys_file = self.storage.join(self._keys_file)
        for i in self.index.candidates(key):
            sample = self[i]
            found = sample["__key__"]
            if found == key:
                return sample
            if key_hash(found) != h:  # not a hash collision: the entry is wrong
                raise FormatError(
                    f"{keys_file} is damaged: it files sample {i} under the hash of {key!r}, "
                    f"but sample {i} has key {found!r}; `shardex verify` checks the table"
                )
        if not self.index.keys_sorted():
            raise FormatError(
                f"{keys_file} is damaged: its key hashes are out of order, so {key!r} cannot "
                "be looked up; `shardex verify` checks the table"
            )
        raise SampleNotFoundError(
            f"no sample with key {key!r} in split {self.split!r} of {self.storage.uri}"
        )

    def get_many(self, indices: Sequence[int], *, coalesce_gap: int | None = None) -> list[Sample]:
        """Samples in the order asked, read as one batch.

        Local reads (``coalesce_gap`` 0, the default there) go one by one in the order
        asked. Otherwise reads are sorted per shard; two reads of a shard merge when the
        gap between them is at most ``coalesce_gap`` bytes (default: 0 locally; on object
        storage its ``coalesce_gap`` storage option, 64 KiB unless set: 0 fetches only the
        samples' bytes, a larger gap makes fewer requests). Whole shards are never
        fetched. On object storage the reads run concurrently.
        """
        gap = coalesce_gap if coalesce_gap is not None else self.storage.coalesce_gap
        if gap is None:
            gap = DEFAULT_COALESCE_GAP
        if self._pending:
            self._load_members()
        if gap == 0 and self._all_local and self.members is not None:
            # ds[i] per sample: each read verified and cut while its bytes are in the CPU
            # cache; gathering the records with numpy first measured ~15 % slower
            getitem = self.__getitem__
            tolist = getattr(indices, "tolist", None)  # a numpy array: its numbers as ints
            wanted = tolist() if tolist is not None else indices
            if self._pid == _PROCESS[0]:
                return self._mapped_batch(wanted)
            return [getitem(int(i)) for i in wanted]
        import numpy as np  # here: a batch from object storage sorts its reads with it

        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return []
        idx = np.where(idx < 0, idx + self._n, idx)
        if idx.min() < 0 or idx.max() >= self._n:
            raise IndexError(f"indices out of range for a split of {self._n} samples")
        rec = self.index.samples[idx]
        if gap == 0 and self._all_local:
            return self._get_local(idx, rec)
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
        try:
            return self._read_many(idx, order, blocks, offs, lens, sums)
        except (FormatError, ObjectNotFoundError) as exc:
            self._check_replaced(exc)
            raise

    def _mapped_batch(self, wanted: Sequence[int]) -> list[Sample]:
        """Local format 3 samples in the order asked: ``ds[i]`` of each, inlined (the
        sample checked in place and sliced out of its mapped shard); a sample of a shard
        not mapped yet, or one that fails a check, goes through ``ds[i]`` itself."""
        out: list[Sample] = []
        unpack, raw, n, getitem = self._unpack, self._raw, self._n, self.__getitem__
        views, maps, sizes, count = self._views, self._maps, self._sizes, self._count
        seed, verify, decode, inside = self._seed, self.verify, self.decode, self._inside
        munpack, mraw, msize, columns = self._munpack, self._mraw, self._msize, self._columns
        assert munpack is not None  # called with members only
        for i in wanted:
            index = int(i)
            if index < 0:
                index += n
            if not 0 <= index < n:
                raise IndexError(f"sample {i} is out of range for a split of {n} samples")
            offset, checksum, shard, length = unpack(raw, index * 24)
            sample: Sample | None = None
            if shard < count:
                view, stop = views[shard], offset + length
                at = index * msize
                row = munpack(mraw, at)
                key_len = row[2]
                if (
                    view is not None
                    and stop <= sizes[shard]
                    and key_len != ABSENT
                    and (
                        _xxh3(view[offset:stop], index * seed) == checksum
                        and _xxh3(mraw[at + 8 : at + msize], checksum) == row[0]
                        if verify
                        else inside(row, length)
                    )
                ):
                    mapped = maps[shard]
                    sample = {}
                    for name, j in columns:
                        size = row[j + 1]
                        if size != ABSENT:
                            begin = offset + row[j]
                            sample[name] = mapped[begin : begin + size]
                    if decode:
                        sample = decode_fields(sample)
                    key_at = offset + row[1]
                    key = mapped[key_at : key_at + key_len]
                    sample["__key__"] = key.decode("utf-8", "replace")
            out.append(getitem(index) if sample is None else sample)
        return out

    def _get_local(self, idx: np.ndarray, rec: npt.NDArray[np.void]) -> list[Sample]:
        """Local samples one by one in the order asked: each read is verified and parsed
        while its bytes are still in the CPU cache, where reading a whole batch first
        would leave them to be fetched again from memory."""
        out: list[Sample] = []
        fast, checked = self._fast, self.__getitem__
        for number, off, checksum, shard, length in zip(
            idx.tolist(),
            rec["offset"].tolist(),
            rec["checksum"].tolist(),
            rec["shard"].tolist(),
            rec["length"].tolist(),
            strict=True,
        ):
            sample = fast(number, off, checksum, shard, length)
            out.append(checked(number) if sample is None else sample)
        return out

    def _read_many(
        self,
        idx: np.ndarray,
        order: np.ndarray,
        blocks: list[tuple[int, int, int, int]],
        offs: list[int],
        lens: list[int],
        sums: list[int],
    ) -> list[Sample]:
        datas = self._read_blocks([(b[0], b[1], b[2]) for b in blocks])
        out: list[Sample | None] = [None] * len(idx)
        pos, first = order.tolist(), 0
        numbers = idx[order].tolist()
        for (shard, start, _length, stop), data in zip(blocks, datas, strict=True):
            for k in range(first, stop):
                at = offs[k] - start
                out[pos[k]] = self._sample(
                    data[at : at + lens[k]], sums[k], shard, offs[k], numbers[k]
                )
            first = stop
        return out  # type: ignore[return-value]

    def _read_blocks(self, blocks: list[tuple[int, int, int]]) -> list[bytes]:
        """Read (shard, offset, length) blocks: preads locally, one concurrent batch remotely."""
        if all(self._local[shard] is not None for shard, _, _ in blocks):
            return [self._read(shard, off, n) for shard, off, n in blocks]
        for shard, off, n in blocks:
            if off + n > self._sizes[shard]:
                self._read(shard, off, n)  # raises the out-of-shard error
        datas = self.storage.get_range_batch([(self._paths[s], o, n) for s, o, n in blocks])
        for (shard, _off, n), data in zip(blocks, datas, strict=True):
            if len(data) != n:
                raise FormatError(
                    f"{self.storage.join(self._paths[shard])} is shorter than "
                    "its index says (truncated?)"
                )
        return datas

    def __iter__(self) -> Iterator[Sample]:
        """Samples in shard order.

        Local shards are read sample by sample (the kernel reads ahead); remote shards are
        streamed, one GET per shard, holding one chunk of the stream (256 KiB and what
        else had arrived, ~1 MiB at most seen; 4 MiB through the helper process of a
        forked worker) and the shard's records and members rows (~0.2 KB a sample).
        """
        if self._pending:
            self._load_members()
        remote = [path for shard, path in enumerate(self._paths) if self._local[shard] is None]
        # each remote shard's GET sent as the one before it is read (see iter_objects)
        streams = self.storage.iter_objects(remote, self.stream_chunk_size) if remote else None
        try:
            yield from self._shards(streams)
        finally:  # stopped early: the request sent ahead ends too
            close = getattr(streams, "close", None)
            if close is not None:
                close()

    def _shards(self, streams: Iterator[Iterator[bytes]] | None) -> Iterator[Sample]:
        """Every shard's samples in order; ``streams``: the remote shards' streams."""
        for shard, path in enumerate(self._paths):
            lo, hi = self._first[shard], self._first[shard + 1]
            if self._local[shard] is None:
                assert streams is not None
                yield from self._remote_shard(shard, path, lo, hi, next(streams))
                continue
            try:
                self._open(shard)
            except ObjectNotFoundError as exc:  # every sample of a missing shard is lost
                for number in range(lo, hi):
                    self._skip(number, exc)
                continue
            if self._views[shard] is not None and self.members is not None:
                yield from self._mapped_shard(shard, lo, hi)
            else:
                yield from self._local_shard(shard, lo, hi)

    def _local_shard(self, shard: int, first: int, end: int) -> Iterator[Sample]:
        """Samples ``first`` to ``end`` (excluded) of an open local shard, read
        ``read_chunk_size`` bytes at a time and parsed in place: one system call and no
        copy per sample. A sample that fails any check is read again the checked way,
        which raises (or skips) with the error of ``ds[i]``."""
        ranges = [(off, n, checksum) for off, checksum, _, n in self.index.records(first, end)]
        fd, size, where = self._fds[shard], self._sizes[shard], self._paths[shard]
        seed, verify, decode = self._seed, self.verify, self.decode
        cut = self._cut if self.members is not None else None
        chunk = self.read_chunk_size
        buf, view, base, top = b"", memoryview(b""), 0, 0  # buf holds bytes [base, top)
        for number, (off, length, checksum) in enumerate(ranges, first):
            stop = off + length
            if (off < base or stop > top) and fd is not None and stop <= size:
                buf = _pread(fd, min(max(chunk, length), size - off), off)
                view, base, top = memoryview(buf), off, off + len(buf)
            sample: Sample | None = None
            if base <= off and stop <= top:
                start = off - base
                if not verify or _xxh3(view[start : start + length], number * seed) == checksum:
                    if cut is not None:
                        sample = cut(buf, start, number, checksum, start + length)
                    else:
                        try:
                            key, fields = parse_sample(
                                buf, where=where, start=start, stop=stop - base
                            )
                        except FormatError:
                            pass
                        else:
                            sample = decode_fields(fields) if decode else cast(Sample, fields)
                            sample["__key__"] = key
            if sample is None:
                sample = self._read_checked(shard, off, length, checksum, number)
                if sample is None:
                    continue
            yield sample

    def _mapped_shard(self, shard: int, first: int, end: int) -> Iterator[Sample]:
        """Samples ``first`` to ``end`` (excluded) of a mapped local shard (format 3), in
        one pass over their records and members rows: what ``ds[i]`` does (each sample
        checked in place, its row checked, its fields sliced out of the mapping), inlined
        without its per-call work (a call to ``_cut`` per sample cost ~0.5 us, 15 %).
        A sample that fails a check, or whose row says to parse, goes the checked way."""
        mapped, view, size = self._maps[shard], self._views[shard], self._sizes[shard]
        assert mapped is not None  # called for mapped shards only
        assert view is not None
        assert self.members is not None
        seed, verify, decode, inside = self._seed, self.verify, self.decode, self._inside
        mraw, msize, columns = self._mraw, self._msize, self._columns
        at = first * msize + 8 - msize  # the checked part of the row: [at, at + msize - 8)
        for number, (off, checksum, _, length), row in zip(
            range(first, end),
            self.index.records(first, end),
            self.members.unpacked(first, end),
            strict=True,
        ):
            at += msize
            stop, key_len = off + length, row[2]
            sample: Sample | None = None
            if (
                stop <= size
                and key_len != ABSENT
                and (
                    _xxh3(view[off:stop], number * seed) == checksum
                    and _xxh3(mraw[at : at + msize - 8], checksum) == row[0]
                    if verify
                    else inside(row, length)
                )
            ):
                sample = {}
                for name, j in columns:
                    n = row[j + 1]
                    if n != ABSENT:
                        begin = off + row[j]
                        sample[name] = mapped[begin : begin + n]
                if decode:
                    sample = decode_fields(sample)
                key_at = off + row[1]
                sample["__key__"] = mapped[key_at : key_at + key_len].decode("utf-8", "replace")
            if sample is None:
                sample = self._read_checked(shard, off, length, checksum, number)
                if sample is None:
                    continue
            yield sample

    def _read_checked(
        self, shard: int, off: int, length: int, checksum: int, number: int
    ) -> Sample | None:
        """A sample the fast way could not take, read and checked the checked way; None:
        it was damaged and is skipped (on_error="skip")."""
        try:
            return self._sample(self._read(shard, off, length), checksum, shard, off, number)
        except FormatError as exc:
            self._skip(number, exc)
            return None

    def _skip(self, number: int, exc: FormatError | ObjectNotFoundError) -> None:
        """Raise, or (on_error="skip") record and log a damaged sample; a replaced export
        is never skipped over (ExportReplacedError)."""
        self._check_replaced(exc)
        if self.on_error != "skip":
            raise exc
        self.skipped.append((number, str(exc)))
        import logging  # here: ~4 ms to import, and only a skipped sample logs

        log = logging.getLogger(__name__)
        log.warning("skipped damaged sample %d of split %r: %s", number, self.split, exc)

    def _remote_shard(
        self, shard: int, path: str, first: int, end: int, chunks: Iterator[bytes]
    ) -> Iterator[Sample]:
        """Samples ``first`` to ``end`` (excluded) of a remote shard, from one streamed
        GET (``chunks``), holding about one chunk."""
        try:
            yield from self._samples_of_stream(shard, path, chunks, first, end)
        finally:  # stopped early: end the request now, not when collected
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _samples_of_stream(
        self, shard: int, path: str, chunks: Iterator[bytes], first: int, end: int
    ) -> Iterator[Sample]:
        """Samples ``first`` to ``end`` (excluded) of a shard's stream (``chunks``: the
        ``bytes`` obstore made for each chunk), in one pass over their records and
        members rows as :meth:`_mapped_shard` does: each sample checked in place (through
        a view), its row checked, its fields sliced straight out of the chunk (one copy a
        field; a slice of ``bytes`` is that copy, where a view's slice and ``tobytes``
        cost ~0.4 us a sample more). A sample that fails a check, or whose row says to
        parse, is copied out and goes the checked way.
        """
        # window: the shard's bytes [base, top), as bytes and as a view (for the checks)
        window, view, base, top = b"", memoryview(b""), 0, 0
        seed, verify, decode, inside = self._seed, self.verify, self.decode, self._inside
        # Lists, not the iterators over the index mappings: a struct iterator left in a
        # frame that an error's traceback keeps alive crashed the garbage collector.
        records = list(self.index.records(first, end))
        # Without members every sample goes the checked way (as a row that says to parse).
        members = self.members
        rows: list[tuple[int, ...]] = (
            list(members.unpacked(first, end))
            if members is not None
            else [(0, 0, ABSENT)] * len(records)
        )
        mraw, msize, columns = self._mraw, self._msize, self._columns
        checked = msize - 8  # the checked part of a row: [at, at + checked)
        at = first * msize + 8 - msize
        for number, (off, checksum, _, length), row in zip(
            range(first, end), records, rows, strict=True
        ):
            at += msize
            stop = off + length
            if stop <= top:
                buf, data, start = window, view, off - base
            else:
                # The sample runs into the next chunk(s): only its own bytes are joined;
                # the last chunk becomes the window.
                parts = [window[off - base :]]
                have = len(parts[0])
                while have < length:
                    try:
                        chunk = next(chunks, None)
                    except ObjectNotFoundError as exc:  # a missing shard: all is lost
                        for lost in range(number, end):
                            self._skip(lost, exc)
                        return
                    if chunk is None:  # a short shard: this sample and the rest are lost
                        short = FormatError(
                            f"{self.storage.join(path)} is shorter than its index says"
                        )
                        for lost in range(number, end):
                            self._skip(lost, short)
                        return
                    parts.append(chunk)
                    have += len(chunk)
                window, base = parts[-1], off + have - len(parts[-1])
                view, top = memoryview(window), base + len(window)
                if base == off:  # the sample starts the window: nothing to join
                    buf, data, start = window, view, 0
                else:
                    parts[-1] = window[: stop - base]
                    buf = b"".join(parts)
                    data, start = memoryview(buf), 0
            key_len = row[2]
            if key_len != ABSENT and (
                _xxh3(data[start : start + length], number * seed) == checksum
                and _xxh3(mraw[at : at + checked], checksum) == row[0]
                if verify
                else inside(row, length)
            ):
                sample: Sample = {}
                for name, j in columns:
                    n = row[j + 1]
                    if n != ABSENT:
                        begin = start + row[j]
                        sample[name] = buf[begin : begin + n]
                if decode:
                    sample = decode_fields(sample)
                key_at = start + row[1]
                sample["__key__"] = buf[key_at : key_at + key_len].decode("utf-8", "replace")
            else:
                try:
                    sample = self._sample_in(
                        buf[start : start + length], 0, length, checksum, shard, off, number
                    )
                except FormatError as exc:
                    self._skip(number, exc)
                    continue
            yield sample

    def keys(self) -> Iterator[str]:
        """Sample keys in sample order (from the metadata)."""
        yield from self.metadata.column("key").to_pylist()

    @cached_property
    def metadata(self) -> pa.Table:
        try:
            from shardex.backends.metadata import read_metadata

            return read_metadata(self.storage, self.config, self.split)
        except (FormatError, ObjectNotFoundError) as exc:
            self._check_replaced(exc)
            raise
