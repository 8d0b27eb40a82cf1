"""The typed sample model: a scan table's members read as flat columns.

A scan table (see :mod:`shardex.sources.base`) holds each sample's members in the
``_members`` column, a list of structs ``ext, path, offset, size, data``. The export engine
reads that column once into :class:`Members`: flat arrays over every member of every
sample, so that sizes, extensions and bytes are reached by index, without one Python dict
per member (a 20k-sample export spent seconds building and reading such dicts).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.errors import BadSampleError
from shardex.quoting import quoted
from shardex.sources.base import MEMBER_TYPE, MEMBERS, MemberRow
from shardex.storage import Storage
from shardex.storage.fetch.held import HeldReads, HeldTar
from shardex.storage.fetch.objects import ObjectReads, registered, sized

#: Files a reader keeps open at most (a tar source reads many members of few files).
_OPEN_FILES: Final = 64
#: A carried slice's rows are mostly repeated paths: zstd (level 1) makes them about 5x
#: smaller (2.3x smaller than lz4, measured on object-store references) for little CPU.
_CARRIED: Final = pa.ipc.IpcWriteOptions(
    compression=pa.Codec("zstd", 1) if pa.Codec.is_available("zstd") else None
)
#: The column of a spilled batch in the object store that holds the planned sizes.
PLANNED_SIZE: Final = "_planned_size"


@dataclass(frozen=True, slots=True)
class Members:
    """Every member of some samples. Sample ``i`` holds members ``starts[i]`` to
    ``starts[i + 1]``; member ``j`` is ``data[j]`` (inline bytes) when ``inline[j]``, else
    ``size[j]`` bytes of the local file ``path(j)`` at ``offset[j]`` (-1: the whole file),
    or of the object ``path(j)`` names by URL (a source on object storage; ``stores`` are
    the storages such URLs are read from, see :mod:`shardex.storage.fetch.objects`).
    Extensions and paths are dictionary-coded: a million members of one tar hold one
    path string, not a million."""

    starts: npt.NDArray[np.int64]
    ext_codes: npt.NDArray[np.int32]
    ext_names: tuple[str, ...]
    #: -1 where the member has no file (inline bytes).
    path_codes: npt.NDArray[np.int32]
    path_names: tuple[str, ...]
    offset: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    inline: npt.NDArray[np.bool_]
    #: Inline bytes, one row per member (null: none): chunked as the source's batches
    #: came, so that joining them copies no image bytes (see :class:`ByteSource`).
    data: pa.ChunkedArray
    #: Storages by root URL for members named by URL (empty when none is).
    stores: tuple[tuple[str, Storage], ...] = ()
    #: Tars whose members a Ray task's scan kept in the object store (read from there
    #: rather than fetched again: see :mod:`shardex.storage.fetch.held`).
    held: tuple[HeldTar, ...] = ()

    @classmethod
    def of(
        cls,
        column: pa.ChunkedArray | pa.Array,
        stores: tuple[tuple[str, Storage], ...] | None = None,
        held: tuple[HeldTar, ...] = (),
    ) -> Members:
        """Read a ``_members`` column (one pass over its references; no bytes copied:
        a column of several chunks keeps its bytes in them). ``stores``: those that serve
        its URLs (default: the ones registered in this process); ``held``: tars that
        some of them hold."""
        if isinstance(column, pa.Array):
            column = pa.chunked_array([column], column.type)
        if len(column) == 0:
            column = pa.chunked_array([pa.array([], pa.list_(MEMBER_TYPE))])
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        starts = np.zeros(len(column) + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        flat = pc.list_flatten(column)

        def field(name: str) -> pa.Array:  # the small fields, joined: no image bytes
            return _joined(pc.struct_field(flat, name))

        data = pc.struct_field(flat, "data").cast(pa.large_binary())  # values not copied
        ext_codes, ext_names = _codes(field("ext"))
        path_codes, path_names = _codes(field("path"))
        remote = any("://" in name for name in path_names)
        return cls(
            starts=starts,
            ext_codes=ext_codes,
            ext_names=ext_names,
            path_codes=path_codes,
            path_names=path_names,
            offset=field("offset").to_numpy(zero_copy_only=False).astype(np.int64),
            size=field("size").to_numpy(zero_copy_only=False).astype(np.int64),
            inline=pc.is_valid(data).to_numpy(zero_copy_only=False),
            data=data,
            stores=(registered() if stores is None else stores) if remote else (),
            held=held if remote else (),
        )

    @classmethod
    def empty(cls) -> Members:
        return cls.of(pa.array([], pa.list_(MEMBER_TYPE)))

    @property
    def num_samples(self) -> int:
        return len(self.starts) - 1

    def ext(self, j: int) -> str:
        return str(self.ext_names[self.ext_codes[j]])

    def path(self, j: int) -> str | None:
        code = self.path_codes[j]
        return None if code < 0 else self.path_names[code]

    def inline_bytes(self) -> int:
        """Bytes held inline (in this process's memory)."""
        return int(self.size[self.inline].sum())

    def mostly_inline(self) -> bool:
        """Whether most of the bytes are inline (an in-memory source)."""
        return self.inline_bytes() * 2 > int(self.size.sum())

    def subset(self, rows: npt.NDArray[np.int64]) -> Members:
        """The members of the given samples, in that order (for a worker's job: only its
        own references travel)."""
        counts = self.starts[rows + 1] - self.starts[rows]
        starts = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        picks = (
            np.arange(int(starts[-1]), dtype=np.int64)
            - np.repeat(starts[:-1], counts)
            + np.repeat(self.starts[rows], counts)
        )
        paths = self.path_codes[picks]
        used, path_codes = np.unique(paths, return_inverse=True)
        names = tuple(self.path_names[c] for c in used.tolist() if c >= 0)
        if len(used) and used[0] < 0:  # -1 (no file) stays -1
            path_codes = path_codes - 1
        return Members(
            starts=starts,
            ext_codes=self.ext_codes[picks],
            ext_names=self.ext_names,
            path_codes=path_codes.astype(np.int32),
            path_names=names,
            offset=self.offset[picks],
            size=self.size[picks],
            inline=self.inline[picks],
            data=self.data.take(pa.array(picks, pa.int64())),
            stores=self.stores,
            held=self.held,
        )


def _joined(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One array of a (small) chunked column."""
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values


def _codes(values: pa.Array) -> tuple[npt.NDArray[np.int32], tuple[str, ...]]:
    """Dictionary codes of a string array (-1 for null) and its distinct values."""
    encoded = pc.dictionary_encode(values)
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, tuple(encoded.dictionary.to_pylist())


@dataclass(frozen=True, slots=True)
class SizesFile:
    """Planned sample sizes kept in a local file (``<i8`` each), read only where sliced:
    a split's sizes are not held in memory (nor mapped, which would count its pages in
    the process's resident memory as they are touched)."""

    path: str
    begin: int
    end: int

    def __len__(self) -> int:
        return self.end - self.begin

    def __getitem__(self, where: slice) -> SizesFile:
        start, stop, step = where.indices(len(self))
        if step != 1:
            raise ValueError("sizes are sliced with step 1 only")
        return SizesFile(self.path, self.begin + start, self.begin + max(start, stop))

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[np.int64]:
        count = len(self)
        out = np.fromfile(self.path, "<i8", count, offset=8 * self.begin) if count else None
        return (out if out is not None else np.zeros(0, np.int64)).astype(np.int64)


#: Sizes of a split: in memory, or in a local file.
Sizes: TypeAlias = npt.NDArray[np.int64] | SizesFile


@dataclass(frozen=True, slots=True)
class SpillSlice:
    """Candidates ``[offset, offset + count)`` of the record batches ``batches`` of a
    split's spill file (an Arrow IPC file on local scratch, see
    :mod:`shardex.engine.spill`): what a worker's job names instead of carrying rows."""

    path: str
    batches: tuple[int, ...]
    offset: int
    count: int
    #: The stores of a source on object storage, registered where the job was made: a
    #: worker (forked from shardex's fork server, not from the exporting process) has
    #: none of its own.
    stores: tuple[tuple[str, Storage], ...] = ()
    #: The slice's rows themselves (an Arrow IPC stream: keys, metadata and member
    #: references, never sample bytes), for a worker on another machine, which cannot
    #: see this one's scratch (see :meth:`carried`); None: read from ``path``.
    rows_ipc: bytes | None = None
    #: The split's rows kept in Ray's object store instead of a file (see
    #: :class:`SpilledRows`): the handles of ``batches``, each an Arrow IPC stream of
    #: the batch's rows and their planned sizes (column :data:`PLANNED_SIZE`).
    refs: tuple[Any, ...] = ()
    #: The tars its members come from whose bytes Ray holds (see :class:`Members`).
    held: tuple[HeldTar, ...] = ()

    def _table(self, read: dict[int, pa.RecordBatch] | None = None) -> pa.Table:
        if self.rows_ipc is not None:
            return pa.ipc.open_stream(pa.py_buffer(self.rows_ipc)).read_all()
        if self.refs:
            import ray  # a job with handles runs in a Ray task

            datas = ray.get(list(self.refs))
            tables = [pa.ipc.open_stream(pa.py_buffer(d)).read_all() for d in datas]
            return pa.concat_tables(tables).slice(self.offset, self.count)
        kept = read if read is not None else {}
        with pa.OSFile(self.path) as f:
            reader = pa.ipc.open_file(f)
            batches = [kept[i] if i in kept else reader.get_batch(i) for i in self.batches]
        if read is not None:  # the next slice starts in this one's last batch
            read.clear()
            read.update(zip(self.batches, batches, strict=True))
        return pa.Table.from_batches(batches).slice(self.offset, self.count)

    def read(self) -> tuple[pa.Table, Members]:
        """The candidates' rows (no members) and their members: only these batches are
        read (no memory map of the whole file)."""
        rows, members, _ = self.read_sized()
        return rows, members

    def read_sized(self) -> tuple[pa.Table, Members, npt.NDArray[np.int64] | None]:
        """:meth:`read`, and the candidates' planned sizes when the slice holds them
        (rows in the object store: the job carries none)."""
        table = self._table()
        sizes = None
        if PLANNED_SIZE in table.column_names:
            sizes = table.column(PLANNED_SIZE).to_numpy().astype(np.int64)
            table = table.drop_columns([PLANNED_SIZE])
        members = Members.of(table.column(MEMBERS), self.stores, self.held)
        return table.drop_columns([MEMBERS]), members, sizes

    def carried(self, read: dict[int, pa.RecordBatch] | None = None) -> SpillSlice:
        """This slice with its rows read into the job (zstd Arrow IPC), so that the worker
        needs nothing from this machine's disk. ``read``: the batches the slice before
        read (consecutive slices share one), replaced by this slice's."""
        if self.rows_ipc is not None or self.refs:  # carried, or fetched by the worker
            return self
        table = self._table(read)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=_CARRIED) as writer:
            writer.write_table(table)
        return dataclasses.replace(self, rows_ipc=sink.getvalue().to_pybytes())


@dataclass(frozen=True, slots=True)
class SpilledRows:
    """A split's candidate samples in a spill file on local scratch: ``starts`` are the
    first rows of its record batches (and the number of rows last), ``sizes`` their
    planned sizes. Workers read their own slices (see :class:`SpillSlice`)."""

    path: str
    starts: npt.NDArray[np.int64]
    #: In memory (up to a million samples), or in a file.
    sizes: Sizes
    #: :func:`shardex.planning.content_digest` of its keys and sizes.
    digest: str
    #: The record batches held in Ray's object store instead of ``path`` (a remote
    #: runner's export: a task on any machine fetches its own slice, the exporting
    #: process never reads them back), with their planned sizes.
    refs: tuple[Any, ...] = ()
    #: Per record batch of ``refs``: the held tars its members come from (see
    #: :mod:`shardex.storage.fetch.held`), whose refs a shard job carries.
    held: tuple[tuple[HeldTar, ...], ...] = ()

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    def inline(self) -> bool:
        """Spilled samples are references to files: workers read them."""
        return False

    def slice(self, start: int, stop: int) -> SpillSlice:
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, max(start, stop - 1), side="right")) - 1
        last = max(first, min(last, len(self.starts) - 2))
        offset = start - int(self.starts[first])
        batches = tuple(range(first, last + 1))
        refs = tuple(self.refs[i] for i in batches) if self.refs else ()
        held = {tar.url: tar for i in batches if self.held for tar in self.held[i]}
        return SpillSlice(
            self.path,
            batches,
            offset,
            stop - start,
            registered(),
            refs=refs,
            held=tuple(held.values()),
        )


@dataclass(frozen=True, slots=True)
class SplitRows:
    """A split's candidate samples, in order: their metadata (``rows``, no members),
    their members (candidate ``i`` is sample ``member_rows[i]`` of ``members``) and their
    planned tar sizes."""

    rows: pa.Table
    members: Members
    member_rows: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]

    @property
    def num_samples(self) -> int:
        return int(self.rows.num_rows)

    def inline(self) -> bool:
        """Whether most bytes are in memory (then written in this process)."""
        sizes = self.members.size
        return bool(self.members.inline_bytes() * 2 > int(sizes.sum()))


class _Arena:
    """Reused memory for the bytes read from files: slices of a few large buffers, each
    reused once no view of it is left (the shard writer drops its views when it writes
    them out). A fresh ``bytes`` per file costs the kernel's page faults on memory the
    allocator took back: measured 22 µs a 16 KB file read into new bytes, 11-14 µs into
    reused memory, 9-11 µs for the system calls alone (the 2-core VM, load 8)."""

    def __init__(self) -> None:
        self._buffers: list[bytearray] = []
        self._view: memoryview | None = None
        self._at = 0

    def take(self, size: int) -> memoryview | None:
        """``size`` writable bytes no view returned before overlaps (None: too large)."""
        if size > _ARENA_BYTES // 4:
            return None
        if self._view is None or self._at + size > len(self._view):
            self._next()
        assert self._view is not None
        at, self._at = self._at, self._at + size
        return self._view[at : at + size]

    def _next(self) -> None:
        """A buffer no view holds any more, or a new one."""
        if self._view is not None:
            self._view.release()  # its slices still hold the buffer while they live
        for buffer in self._buffers:
            try:  # a buffer with views cannot change size: the test that none is left
                buffer.append(0)
            except BufferError:
                continue
            del buffer[-1]
            break
        else:
            buffer = bytearray(_ARENA_BYTES)
            self._buffers.append(buffer)
        self._view, self._at = memoryview(buffer), 0


#: Bytes of one arena buffer (a shard writer holds about two while it gathers 4 MiB).
_ARENA_BYTES: Final = 8 << 20


class _Files:
    """Byte ranges of local files, recently used files kept open. ``reuse``: the bytes
    come back as views of reused memory (see :class:`_Arena`), else as ``bytes``."""

    def __init__(self, reuse: bool = False) -> None:
        self._fds: dict[str, int] = {}
        self._arena = _Arena() if reuse else None

    def read(self, path: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of ``path`` (``offset`` -1: the whole file).

        Raises:
            BadSampleError: the file cannot be read, or its size changed.
        """
        data = self._get(path, offset, size, None)
        assert isinstance(data, bytes)  # read into no buffer
        return data

    def read_reused(self, path: str, offset: int, size: int) -> bytes | memoryview:
        """:meth:`read`, the bytes as a view of reused memory (see :class:`_Arena`)."""
        into = None
        if self._arena is not None:  # a whole file: one byte more shows if it grew
            into = self._arena.take(size + 1 if offset < 0 else size)
        return self._get(path, offset, size, into)

    def read_into(self, path: str, offset: int, size: int, into: memoryview) -> None:
        """:meth:`read` into ``into`` (``size`` bytes; one more for a whole file).

        Raises:
            BadSampleError: the file cannot be read, or its size changed.
        """
        self._get(path, offset, size, into)

    def _get(
        self, path: str, offset: int, size: int, into: memoryview | None
    ) -> bytes | memoryview:
        try:
            if offset < 0:  # a whole file: one read of one byte more shows if it grew
                whole = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    data = _read(whole, size + 1, into)
                finally:
                    os.close(whole)
            else:
                fd = self._fds.get(path)
                if fd is None:
                    if len(self._fds) > _OPEN_FILES:
                        self.close()
                    fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                data = _pread(fd, size, offset, into)
        except OSError as exc:
            raise BadSampleError(
                f"cannot read {quoted(path)}: {exc.strerror}",
                path=path,
                reason=f"cannot read {quoted(path)}: {exc.strerror or exc}",
            ) from exc
        if len(data) != size:  # the file changed since it was listed: refused there
            sized(bytes(data), size, path)
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def _read(fd: int, size: int, into: memoryview | None) -> bytes | memoryview:
    """Up to ``size`` bytes of ``fd`` (one read), into ``into`` when given."""
    if into is None:
        return os.read(fd, size)
    return into[: os.readv(fd, [into])]


def _pread(fd: int, size: int, offset: int, into: memoryview | None) -> bytes | memoryview:
    """Up to ``size`` bytes of ``fd`` at ``offset`` (one read), into ``into`` when given."""
    if into is None or not hasattr(os, "preadv"):
        return os.pread(fd, size, offset)
    return into[: os.preadv(fd, [into], offset)]


class ByteSource:
    """Reads members' bytes: inline ones as views of their Arrow buffer, file ones with
    ``pread`` (keeping recently used files open), objects with a GET each (fetched ahead,
    concurrently, once :meth:`expect` says which will be read)."""

    def __init__(self, members: Members) -> None:
        self._m = members
        #: Per chunk of ``members.data``: its value offsets and its bytes (a view).
        self._offsets: list[npt.NDArray[np.int64]] = []
        self._values: list[memoryview] = []
        ends = [0]
        for chunk in members.data.chunks:
            buffers = chunk.buffers()
            at = chunk.offset
            self._offsets.append(np.frombuffer(buffers[1], np.int64)[at : at + len(chunk) + 1])
            # Arrow's buffers are signed chars to memoryview: unsigned, they compare as bytes
            self._values.append(memoryview(buffers[2] if buffers[2] is not None else b"").cast("B"))
            ends.append(ends[-1] + len(chunk))
        #: Member numbers where each chunk starts (a chunk per source batch: few).
        self._chunk_starts = ends
        # the writer drops its views as it writes them out: file bytes go to reused memory
        self._files = _Files(reuse=True)
        self._objects = ObjectReads(members.stores)
        self._held = HeldReads(members.held)
        self._is_url: npt.NDArray[np.bool_] | None = None  # per path name, when first needed
        #: Members :meth:`read_files` read, by number: :meth:`read` takes them from there.
        self._read_ahead: dict[int, memoryview] = {}

    def _url(self, j: int) -> bool:
        """Whether member ``j`` (not inline) is an object named by URL."""
        if self._is_url is None:
            names = self._m.path_names
            self._is_url = np.fromiter(("://" in n for n in names), bool, len(names))
        code = self._m.path_codes[j]
        return bool(code >= 0 and self._is_url[code])

    def _held_bytes(self, j: int, url: str) -> memoryview | None:
        """Member ``j`` (of the object ``url``) as a Ray task's scan held it, if it did."""
        if not self._held:
            return None
        return self._held.read(url, int(self._m.offset[j]), int(self._m.size[j]))

    def expect(self, js: Iterable[int]) -> None:
        """The members that will be read, in that order: those on object storage are
        fetched ahead (call it only with members that will be read, or their bytes are
        fetched for nothing)."""
        self._objects.expect(self._fetched(js))

    def _fetched(self, js: Iterable[int]) -> Iterator[tuple[int, str, int, int]]:
        """Of members ``js``, those to fetch from object storage (number, URL, offset,
        size): not inline, and not held."""
        m = self._m
        for j in js:
            if m.inline[j] or not self._url(j):
                continue
            url = m.path_names[m.path_codes[j]]
            if self._held_bytes(j, url) is None:
                yield j, url, int(m.offset[j]), int(m.size[j])

    def read(self, j: int) -> memoryview | bytes:
        """Member ``j``'s bytes (a view for inline members: no copy)."""
        if self._read_ahead:
            ahead = self._read_ahead.pop(j, None)
            if ahead is not None:
                return ahead
        m = self._m
        if m.inline[j]:
            starts = self._chunk_starts
            c = 0 if len(starts) == 2 else bisect.bisect_right(starts, j) - 1
            k = j - starts[c]
            offsets = self._offsets[c]
            return self._values[c][offsets[k] : offsets[k + 1]]
        path = m.path(j)
        if path is None:
            raise BadSampleError(f"member {j} has neither bytes nor a file", reason="no data")
        if self._url(j):
            held = self._held_bytes(j, path)
            if held is not None:
                return held
            return self._objects.read(j, path, int(m.offset[j]), int(m.size[j]))
        return self._files.read_reused(path, int(m.offset[j]), int(m.size[j]))

    def read_files(
        self, js: npt.NDArray[np.int64], limit: int
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], list[memoryview]] | None:
        """Members ``js``, all whole local files (an image folder's), read back to back
        into one buffer: its bytes, where each member starts in it, and each member's view
        (:meth:`read` then gives them from there: a caller that falls back to reading them
        one by one reads no file twice). None when one is not a whole local file (a tar's
        members are read one by one into reused memory), they hold more than ``limit``
        bytes, or one cannot be read as listed (the caller then reads them one by one,
        which refuses or records that member)."""
        m = self._m
        codes = m.path_codes[js]
        if m.inline[js].any() or (codes < 0).any() or (m.offset[js] >= 0).any():
            return None
        if any("://" in m.path_names[c] for c in np.unique(codes).tolist()):
            return None  # objects: fetched as they are read
        sizes = m.size[js]
        if (sizes < 0).any() or int(sizes.sum()) > limit:
            return None
        starts = np.zeros(len(js), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        buffer = bytearray(int(sizes.sum()) + 1)
        view = memoryview(buffer)
        names, at, ends = m.path_names, starts.tolist(), (starts + sizes).tolist()
        try:
            for code, lo, hi in zip(codes.tolist(), at, ends, strict=True):
                # a byte more shows if the file grew
                self._files.read_into(names[code], -1, hi - lo, view[lo : hi + 1])
        except BadSampleError:
            return None
        views = list(map(view.__getitem__, map(slice, at, ends)))
        self._read_ahead = dict(zip(js.tolist(), views, strict=True))
        return np.frombuffer(buffer, np.uint8), starts, views

    def close(self) -> None:
        self._read_ahead = {}
        self._files.close()
        self._objects.close()


JSON_COLUMN: Final = "_json"

#: The field that holds the class label (ASCII digits), as WebDataset names it.
LABEL_FIELD: Final = "cls"


class MemberReader:
    """Reads the bytes of members given as dicts (a scan table's rows), keeping recently
    used files open; objects with a GET each, from the stores registered in this
    process (see :mod:`shardex.storage.fetch.objects`)."""

    def __init__(self, stores: tuple[tuple[str, Storage], ...] | None = None) -> None:
        self._files = _Files()
        # stores: those registered where the job was made (a worker has none of its own)
        self._objects = ObjectReads(registered() if stores is None else stores)

    def read(self, member: MemberRow) -> bytes:
        data = member["data"]
        if data is not None:
            return data
        path = member["path"]
        assert path is not None  # a member without bytes names where they are
        if "://" in path:
            return self._objects.read(-1, path, member["offset"], member["size"])
        return self._files.read(path, member["offset"], member["size"])

    def close(self) -> None:
        self._files.close()
        self._objects.close()


def iter_fields(
    rows: pa.Table, with_label: bool, reader: MemberReader
) -> Iterator[list[tuple[str, bytes]]]:
    """Each row's fields in member order: source members, ``cls``, ``json``."""
    n = rows.num_rows
    members = rows.column(MEMBERS).to_pylist()
    labels = rows.column("label").to_pylist() if with_label else [None] * n
    has_json = JSON_COLUMN in rows.column_names
    jsons: list[bytes | None] = rows.column(JSON_COLUMN).to_pylist() if has_json else [None] * n
    for i in range(n):
        fields = [(m["ext"], reader.read(m)) for m in members[i]]
        if labels[i] is not None:
            fields.append((LABEL_FIELD, str(labels[i]).encode()))
        text = jsons[i]
        if text is not None:
            fields.append(("json", text))
        yield fields


def json_text_column(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """NeMo's ``metadata`` column: each sample's scalar metadata as JSON text (or null)."""
    if JSON_COLUMN in rows.column_names:
        return rows.column(JSON_COLUMN).cast(pa.string())
    return pa.nulls(rows.num_rows, pa.string())


__all__ = [
    "JSON_COLUMN",
    "LABEL_FIELD",
    "MEMBERS",
    "ByteSource",
    "MemberReader",
    "Members",
    "SizesFile",
    "SpillSlice",
    "SpilledRows",
    "SplitRows",
    "iter_fields",
    "json_text_column",
]
