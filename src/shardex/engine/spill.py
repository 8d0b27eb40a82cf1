"""Sample references spilled to local scratch, split by split, so that no process holds a
whole dataset's references.

Pass 1 appends each batch's rows of a split to a :class:`Spill` (Arrow IPC streams, a new
segment when a batch's columns differ from the one before: a source's batches may); the
planning pass reads them back in order and writes each split's final rows with
:class:`FinalSpill`, an IPC file of small record batches that a shard job reads a slice
of (see :class:`shardex.refs.rows.SpillSlice`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from shardex.refs.rows import PLANNED_SIZE, Sizes, SizesFile, SpilledRows
from shardex.refs.scan import MEMBERS
from shardex.storage.fetch.held import HeldTar, held_tars

#: Rows per record batch of a final spill: a shard job reads whole batches, so they are
#: about a shard's size (a job of 1,000 candidates reads 1-2 batches).
FINAL_BATCH_ROWS: Final = 1024
#: Spill files are mostly repeated paths and extensions: zstd (level 1) makes them about
#: 5x smaller for little CPU (2.3x smaller than lz4, as fast to write; measured on
#: object-store references): the scratch bytes this process writes and reads back.
_OPTIONS: Final = pa.ipc.IpcWriteOptions(
    compression=pa.Codec("zstd", 1) if pa.Codec.is_available("zstd") else None
)


#: The first bytes of an export's pass-1 spills (zstd rows, about 20 B a sample of an
#: image folder on object storage) are held in memory, all splits together: up to about
#: 800,000 such samples the rows are not written and read back at all. The final spills'
#: planned sizes have a budget of the same size (8 B a sample: 2M samples). Only the
#: driver of a remote runner (Ray) holds them, as every byte it moves counts against the
#: one machine a cluster's export funnels through; a local export spills from its first
#: row, so that its memory does not grow with its source at all.
MEMORY_BYTES: Final = 16 << 20
#: Whether an export without a remote runner holds them too (tests set it).
HELD_LOCALLY = False


@dataclass(slots=True)
class Budget:
    """Bytes that spills sharing it may still hold in memory."""

    left: int


def holds(remote: bool) -> bool:
    """Whether pass-1 scratch is held in memory first: by the driver of a ``remote``
    runner (or where :data:`HELD_LOCALLY`)."""
    return remote or HELD_LOCALLY


def memory_budget(remote: bool = True) -> Budget:
    """A budget of :data:`MEMORY_BYTES` where :func:`holds`, else none; read now: tests
    lower it."""
    return Budget(MEMORY_BYTES if holds(remote) else 0)


class Spill:
    """Rows appended in order, read back in the same order (one split's rows of pass 1):
    in memory while ``budget`` (shared by an export's spills) lasts, then in files."""

    def __init__(self, folder: Path, name: str, budget: Budget | None = None) -> None:
        self._folder, self._name = folder, name
        self._segments: list[Path | pa.Buffer] = []
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._sink: pa.BufferOutputStream | None = None
        self._counted = 0  # bytes of the open in-memory segment taken from the budget
        self._schema: pa.Schema | None = None
        self._budget = budget if budget is not None else memory_budget()
        self._in_files = False
        self.num_rows = 0

    def append(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._sink is not None and self._budget.left <= 0:
            self._close_writer()
            self._in_files = True  # held what it may: the rest goes to files
        if self._writer is None or not table.schema.equals(self._schema):
            self._close_writer()
            self._schema = table.schema
            if self._budget.left > 0 and not self._in_files:
                self._sink = pa.BufferOutputStream()
                self._writer = pa.ipc.new_stream(self._sink, table.schema, options=_OPTIONS)
            else:
                path = self._folder / f"{self._name}-{len(self._segments):04d}.arrows"
                self._segments.append(path)
                self._writer = pa.ipc.new_stream(str(path), table.schema, options=_OPTIONS)
        self._writer.write_table(table)
        self.num_rows += table.num_rows
        if self._sink is not None:
            self._take(self._sink.tell())

    def _take(self, size: int) -> None:
        self._budget.left -= size - self._counted
        self._counted = size

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._sink is not None:
            held = self._sink.getvalue()
            self._segments.append(held)
            self._take(held.size)
            self._sink, self._counted = None, 0

    def tables(self) -> Iterator[pa.Table]:
        """The rows appended, in order, a batch at a time."""
        self._close_writer()
        for segment in self._segments:
            if isinstance(segment, pa.Buffer):
                for batch in pa.ipc.open_stream(segment):
                    yield pa.Table.from_batches([batch])
                continue
            with pa.OSFile(str(segment)) as f:
                for batch in pa.ipc.open_stream(f):
                    yield pa.Table.from_batches([batch])

    def remove(self) -> None:
        self._close_writer()
        for segment in self._segments:
            if isinstance(segment, Path):
                segment.unlink(missing_ok=True)
        self._segments = []


class FinalSpill:
    """A split's final candidate rows (one schema) and their planned sizes, written in
    order; :meth:`close` gives the :class:`SpilledRows` that shard jobs slice.

    ``put``: a remote runner's (Ray's ``put``): each record batch goes to its object
    store, with its planned sizes, instead of the file, so that a shard task on any
    machine fetches its own slice and this process never reads the rows back (nor
    sends them in jobs). The sizes are kept here all the same (in memory while
    ``budget`` lasts, shared by an export's final spills, then in a file), for the
    digest and a byte-capped plan. Each such batch also names the tars its members come
    from that Ray holds (see :mod:`shardex.storage.fetch.held`): their refs go with its rows."""

    def __init__(
        self,
        folder: Path,
        name: str,
        schema: pa.Schema,
        put: Callable[[bytes], Any] | None = None,
        budget: Budget | None = None,
    ) -> None:
        self._path = folder / f"{name}.arrow"
        self._budget = budget if budget is not None else memory_budget()
        self._sizes_path = folder / f"{name}.sizes"
        self._put = put
        self._refs: list[Any] = []
        self._named: list[tuple[HeldTar, ...]] = []  # per batch in the object store
        self._tars = held_tars() if put is not None else None
        self._writer = (
            pa.ipc.new_file(str(self._path), schema, options=_OPTIONS) if put is None else None
        )
        # the sizes in memory while the budget lasts, then in the file
        self._held: list[npt.NDArray[np.int64]] | None = []
        self._sizes: Any = None
        self._starts = [0]
        self._digest = xxhash.xxh3_128()

    def append(self, table: pa.Table, sizes: npt.NDArray[np.int64]) -> None:
        at = 0
        for batch in table.to_batches(max_chunksize=FINAL_BATCH_ROWS):
            if batch.num_rows:
                if self._writer is not None:
                    self._writer.write_batch(batch)
                else:
                    self._refs.append(self._stored(batch, sizes[at : at + batch.num_rows]))
                    self._named.append(self._held_in(batch))
                at += batch.num_rows
                self._starts.append(self._starts[-1] + batch.num_rows)
        self._keep_sizes(sizes.astype("<i8"))
        keys = "\n".join(table.column("key").to_pylist())
        self._digest.update((keys if self._starts[-1] == table.num_rows else "\n" + keys).encode())

    def _keep_sizes(self, sizes: npt.NDArray[np.int64]) -> None:
        if self._held is not None and sizes.nbytes <= self._budget.left:
            self._held.append(sizes)
            self._budget.left -= sizes.nbytes
            return
        if self._sizes is None:
            self._sizes = open(self._sizes_path, "wb")  # noqa: SIM115  # closed in close()
        for held in self._held or ():
            self._sizes.write(held.tobytes())
        self._held = None
        self._sizes.write(sizes.tobytes())

    def _stored(self, batch: pa.RecordBatch, sizes: npt.NDArray[np.int64]) -> Any:
        assert self._put is not None
        sized = batch.append_column(PLANNED_SIZE, pa.array(sizes, pa.int64()))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, sized.schema, options=_OPTIONS) as writer:
            writer.write_batch(sized)
        return self._put(sink.getvalue().to_pybytes())

    def _held_in(self, batch: pa.RecordBatch) -> tuple[HeldTar, ...]:
        """The held tars that the batch's members come from."""
        if not self._tars:
            return ()
        paths = pc.struct_field(pc.list_flatten(batch.column(MEMBERS)), "path")
        return self._tars.named(pc.unique(paths).to_pylist())

    def close(self) -> SpilledRows:
        """The split's rows; their content digest is :func:`shardex.planning.content_digest`'s
        (the keys, then the sizes), computed as they were written."""
        if self._writer is not None:
            self._writer.close()
        n = self._starts[-1]
        sizes: Sizes
        if self._held is not None:  # never written
            sizes = np.concatenate(self._held) if self._held else np.zeros(0, np.int64)
            self._digest.update(sizes.tobytes())
        else:
            self._sizes.close()
            with open(self._sizes_path, "rb") as f:
                while chunk := f.read(1 << 20):
                    self._digest.update(chunk)
            sizes = SizesFile(str(self._sizes_path), 0, n)
        return SpilledRows(
            str(self._path),
            np.array(self._starts, np.int64),
            sizes,
            str(self._digest.hexdigest()),
            refs=tuple(self._refs),
            held=tuple(self._named) if any(self._named) else (),
        )
