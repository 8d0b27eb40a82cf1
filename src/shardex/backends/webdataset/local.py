"""Local shards: one ``pread`` a sample (:class:`Pread`, before format 3), or mapped and
sliced by members rows (:class:`Mapped`: no system call, one copy a field)."""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from xxhash import xxh3_64_intdigest as _xxh3

from shardex.backends.webdataset.access import PROCESS, Access, cut, parsed
from shardex.codecs.fields import decode_fields
from shardex.dataset import Sample
from shardex.errors import FormatError, ObjectNotFoundError, ShardexError, StorageError
from shardex.format.mapped import ABSENT

if TYPE_CHECKING:
    import concurrent.futures

_pread = os.pread


def _close_descriptors(fds: list[int | None], owner: list[int]) -> None:
    if os.getpid() != owner[0]:
        return  # forked: the parent's descriptors are the parent's to close
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class Pread(Access):
    """Local shards opened once per process; a sample is one ``pread``, parsed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        count = self._count = len(self._paths)
        self._files = [str(self.storage.local_path(p)) for p in self._paths]
        self._fds: list[int | None] = [None] * count
        # Closed by a finalizer (a __del__ at shutdown finds the globals gone): a loop
        # opening datasets ran out of descriptors. A fork leaves the parent's alone.
        self._owner = [os.getpid()]
        weakref.finalize(self, _close_descriptors, self._fds, self._owner)
        self._maps: list[mmap.mmap | None] = [None] * count
        self._views: list[memoryview | None] = [None] * count
        self._pid = PROCESS[0]

    def _open(self, shard: int) -> int:
        if self._pid != PROCESS[0]:  # forked: descriptors are per process
            self._fds[:] = [None] * self._count
            self._pid = self._owner[0] = PROCESS[0]
            self._maps, self._views = [None] * self._count, [None] * self._count
        fd = self._fds[shard]
        if fd is None:
            where = self.storage.join(self._paths[shard])
            try:
                fd = self._fds[shard] = os.open(self._files[shard], os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise ObjectNotFoundError(
                    f"shard {where} of split {self.split!r} does not exist (deleted since "
                    "the export was written?); `shardex verify` lists what is missing"
                ) from exc
            except OSError as exc:
                raise StorageError(f"cannot open shard {where}: {exc.strerror}") from exc
            self._map(shard, fd)
        return fd

    def _map(self, shard: int, fd: int) -> None:
        """Map an opened shard (:class:`Mapped` does)."""

    def _fetch(self, shard: int, offset: int, length: int) -> bytes:
        fd = self._fds[shard] if self._pid == PROCESS[0] else None
        return _pread(self._open(shard) if fd is None else fd, length, offset)

    def _send_blocks(
        self, blocks: list[tuple[int, int, int]]
    ) -> concurrent.futures.Future[list[bytes]]:
        import concurrent.futures  # here: a batch with a gap only

        done: concurrent.futures.Future[list[bytes]] = concurrent.futures.Future()
        done.set_result([self._read(shard, off, n) for shard, off, n in blocks])
        return done

    def get(self, index: int) -> Sample:
        """Sample ``index`` the short way, else the checked way (which raises)."""
        if not 0 <= index < self._n:
            index = self._number(index)
        offset, checksum, shard, length = self._unpack(self._raw, index * 24)
        if self._pid == PROCESS[0] and shard < self._count:
            fd = self._fds[shard]
            if fd is not None and offset + length <= self._sizes[shard]:
                buf = _pread(fd, length, offset)
                if len(buf) == length and (
                    not self.verify or _xxh3(buf, index * self.seed) == checksum
                ):
                    try:
                        return parsed(buf, self._paths[shard], 0, None, self.decode)
                    except FormatError:
                        pass  # the checked way raises it (suppress() costs)
        return self._checked(index, offset, checksum, shard, length)

    def start_many(self, indices: Sequence[int], gap: int) -> Callable[[], list[Sample]]:
        if gap:
            return super().start_many(indices, gap)
        return lambda: self.get_many(indices, 0)  # a local read gains nothing from starting early

    def get_many(self, indices: Sequence[int], gap: int) -> list[Sample]:
        if gap:
            return super().get_many(indices, gap)
        # ds[i] per sample, parsed while in the CPU cache: numpy gathering was ~15 % slower
        get, tolist = self.get, getattr(indices, "tolist", None)  # numpy: its ints
        return [get(int(i)) for i in (tolist() if tolist is not None else indices)]

    def iterate(self, read_chunk: int, stream_chunk: int) -> Iterator[Sample]:
        if self._pending:
            self._load_members()
        for shard in range(self._count):
            lo, hi = self._first[shard], self._first[shard + 1]
            try:
                self._open(shard)
            except ObjectNotFoundError as exc:  # every sample of a missing shard is lost
                for number in range(lo, hi):
                    self._skip(number, exc)
                continue
            yield from self._shard(shard, lo, hi, read_chunk)

    def _shard(self, shard: int, first: int, end: int, chunk: int) -> Iterator[Sample]:
        """Samples ``first .. end`` of an open shard, read ``chunk`` bytes at a time and
        parsed in place; one that fails a check goes the checked way."""
        ranges = [(off, n, checksum) for off, checksum, _, n in self.index.records(first, end)]
        fd, size, where = self._fds[shard], self._sizes[shard], self._paths[shard]
        seed, verify, decode = self.seed, self.verify, self.decode
        sliced = self._cut if self.members is not None else None
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
                    if sliced is not None:
                        sample = sliced(buf, start, number, checksum, start + length)
                    else:
                        try:
                            sample = parsed(buf, where, start, stop - base, decode)
                        except FormatError:  # the checked way below says why
                            sample = None
            if sample is None:
                sample = self._read_checked(shard, off, length, checksum, number)
                if sample is None:
                    continue
            yield sample


class Mapped(Pread):
    """Local format-3 shards, mapped: ``ds[i]`` checks in place and slices by its row.
    A shard that cannot be mapped is read as :class:`Pread` reads."""

    def _map(self, shard: int, fd: int) -> None:
        """Map a shard holding at least its listed bytes (a short one is preaded, which
        names the error). shardex never writes a file in place, so a mapping survives
        an overwrite; truncation by something else means SIGBUS."""
        size = self._sizes[shard]
        try:
            if size == 0 or os.fstat(fd).st_size < size:
                return
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # out of mappings, or an odd file: pread serves
            return
        self._maps[shard], self._views[shard] = mapped, memoryview(mapped)

    def get(self, index: int) -> Sample:
        if not 0 <= index < self._n:
            index = self._number(index)
        if self._pending:
            self._load_members()
        offset, checksum, shard, length = self._unpack(self._raw, index * 24)
        if self._pid == PROCESS[0] and shard < self._count:
            view = self._views[shard]
            stop = offset + length
            if view is not None and stop <= self._sizes[shard]:
                # cut() inlined: the call cost ~0.25 us a sample (5 % of a read)
                at = index * self._msize
                row = self._munpack(self._mraw, at)  # type: ignore[misc]  # set by the load
                key_len = row[2]
                if key_len != ABSENT and (
                    _xxh3(view[offset:stop], index * self.seed) == checksum
                    and _xxh3(self._mraw[at + 8 : at + self._msize], checksum) == row[0]
                    if self.verify
                    else self._inside(row, length)
                ):
                    mapped = self._maps[shard]
                    sample: Sample = {}
                    for name, j in self._columns:
                        size = row[j + 1]
                        if size != ABSENT:
                            begin = offset + row[j]
                            sample[name] = mapped[begin : begin + size]
                    if self.decode:
                        sample = decode_fields(sample)
                    key_at = offset + row[1]
                    sample["__key__"] = mapped[key_at : key_at + key_len].decode("utf-8", "replace")
                    return sample
            elif self._fds[shard] is None:
                try:
                    self._open(shard)  # first read of this shard: map it, then read
                except ShardexError:
                    pass  # the checked way below raises it
                else:
                    return self.get(index)
        return self._checked(index, offset, checksum, shard, length)

    def _shard(self, shard: int, first: int, end: int, chunk: int) -> Iterator[Sample]:
        if self._views[shard] is None:
            return super()._shard(shard, first, end, chunk)
        return self._mapped_shard(shard, first, end)

    def _mapped_shard(self, shard: int, first: int, end: int) -> Iterator[Sample]:
        """Samples ``first .. end`` of a mapped shard: ``ds[i]`` inlined, in one pass."""
        mapped, view, size = self._maps[shard], self._views[shard], self._sizes[shard]
        assert mapped is not None  # called for mapped shards only
        assert view is not None
        assert self.members is not None
        seed, verify, decode, inside = self.seed, self.verify, self.decode, self._inside
        mraw, msize, columns = self._mraw, self._msize, self._columns
        at = first * msize + 8 - msize  # a row's checked part: [at, at + msize - 8)
        for number, (off, checksum, _, length), row in zip(
            range(first, end),
            self.index.records(first, end),
            self.members.unpacked(first, end),
            strict=True,
        ):
            at += msize
            stop = off + length
            if (
                stop <= size
                and row[2] != ABSENT
                and (
                    _xxh3(view[off:stop], number * seed) == checksum
                    and _xxh3(mraw[at : at + msize - 8], checksum) == row[0]
                    if verify
                    else inside(row, length)
                )
            ):
                yield cut(mapped, off, row, columns, decode)
                continue
            sample = self._read_checked(shard, off, length, checksum, number)
            if sample is not None:
                yield sample
