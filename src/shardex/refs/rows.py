"""A split's rows as pass 2 gets them: spilled (:class:`SpilledRows`, read a
:class:`SpillSlice` at a time), with their planned sizes in memory or in a file
(:class:`SizesFile`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.format.tables import ZSTD_1, ipc_bytes
from shardex.refs.members import Members
from shardex.refs.scan import MEMBERS
from shardex.storage import Storage
from shardex.storage.fetch.held import HeldTar
from shardex.storage.fetch.objects import registered

PLANNED_SIZE: Final = "_planned_size"


@dataclass(frozen=True, slots=True)
class SizesFile:
    """Planned sample sizes in a local file (``<i8`` each), read only where sliced: not held
    (nor mapped, which would count the pages touched as resident).
    """

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


Sizes: TypeAlias = npt.NDArray[np.int64] | SizesFile


@dataclass(frozen=True, slots=True)
class SpillSlice:
    """Candidates ``[offset, offset + count)`` of record batches ``batches`` of a split's spill
    file: what a worker's job names instead of rows. ``stores``: the source's object stores
    (a forked worker has none); ``rows_ipc``: the rows, for a remote worker; ``refs``: Ray
    handles of the batches (with :data:`PLANNED_SIZE`); ``held``: the tars Ray holds.
    """

    path: str
    batches: tuple[int, ...]
    offset: int
    count: int
    stores: tuple[tuple[str, Storage], ...] = ()
    rows_ipc: bytes | None = None
    refs: tuple[Any, ...] = ()
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
        """The candidates' rows (no members) and their members; only these batches are read."""
        rows, members, _ = self.read_sized()
        return rows, members

    def read_sized(self) -> tuple[pa.Table, Members, npt.NDArray[np.int64] | None]:
        """:meth:`read`, and the planned sizes when the slice holds them (rows kept by Ray)."""
        table = self._table()
        sizes = None
        if PLANNED_SIZE in table.column_names:
            sizes = table.column(PLANNED_SIZE).to_numpy().astype(np.int64)
            table = table.drop_columns([PLANNED_SIZE])
        members = Members.of(table.column(MEMBERS), self.stores, self.held)
        return table.drop_columns([MEMBERS]), members, sizes

    def carried(self, read: dict[int, pa.RecordBatch] | None = None) -> SpillSlice:
        """This slice with its rows in the job (zstd Arrow IPC), needing nothing from this disk.
        ``read``: the batches the slice before read (consecutive slices share one).
        """
        if self.rows_ipc is not None or self.refs:  # carried, or fetched by the worker
            return self
        table = self._table(read)
        return dataclasses.replace(self, rows_ipc=ipc_bytes(table, ZSTD_1))


@dataclass(frozen=True, slots=True)
class SpilledRows:
    """A split's candidates in a spill file: ``starts`` are its record batches' first rows (then
    the count), ``sizes`` their planned sizes; ``refs``/``held``: batches kept by Ray instead.
    """

    path: str
    starts: npt.NDArray[np.int64]
    sizes: Sizes
    digest: str
    refs: tuple[Any, ...] = ()
    held: tuple[tuple[HeldTar, ...], ...] = ()
    #: Whether members are pinned (bytes only this process holds: it writes them).
    pinned: bool = False

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    def inline(self) -> bool:
        """Whether this process writes the split: its pinned bytes are here; references to
        files are read by workers."""
        return self.pinned

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
