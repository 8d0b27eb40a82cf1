"""Sample references spilled to local scratch, split by split, so that no process holds a
whole dataset's references: pass 1 appends to a :class:`Spill`, the planning pass writes
each split's final rows to a :class:`FinalSpill` that shard jobs read slices of.
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

from shardex.format.tables import ZSTD_1, ipc_bytes
from shardex.refs.rows import PLANNED_SIZE, Sizes, SizesFile, SpilledRows
from shardex.refs.scan import MEMBERS
from shardex.storage.fetch.held import HeldTar, held_tars

#: Rows per record batch of a final spill: about a shard, as a job reads whole batches.
FINAL_BATCH_ROWS: Final = 1024


#: Spill bytes held in memory (~800,000 samples of rows; the final spills' sizes get as
#: much), only by a remote runner's driver, the one machine a cluster's export funnels
#: through; a local export spills from its first row, so its memory never grows.
MEMORY_BYTES: Final = 16 << 20
#: Whether an export without a remote runner holds them too (tests set it).
HELD_LOCALLY = False


@dataclass(slots=True)
class Budget:
    """Bytes that spills sharing it may still hold in memory."""

    left: int


def holds(remote: bool) -> bool:
    """Whether pass-1 scratch is held in memory first."""
    return remote or HELD_LOCALLY


def memory_budget(remote: bool = True) -> Budget:
    """A budget of :data:`MEMORY_BYTES` (read now: tests lower it) where :func:`holds`."""
    return Budget(MEMORY_BYTES if holds(remote) else 0)


class Spill:
    """One split's pass-1 rows, read back in order: in memory while the shared ``budget``
    lasts, then in files (a new segment when a batch's columns differ)."""

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
                self._writer = pa.ipc.new_stream(self._sink, table.schema, options=ZSTD_1)
            else:
                path = self._folder / f"{self._name}-{len(self._segments):04d}.arrows"
                self._segments.append(path)
                self._writer = pa.ipc.new_stream(str(path), table.schema, options=ZSTD_1)
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
    """A split's final candidate rows and planned sizes; :meth:`close` gives the
    :class:`SpilledRows` that shard jobs slice.

    With ``put`` (a remote runner's), each batch goes to its object store instead, naming
    the held tars its members come from, so a task anywhere fetches its own slice; the
    sizes stay here for the digest and a byte-capped plan.
    """

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
            pa.ipc.new_file(str(self._path), schema, options=ZSTD_1) if put is None else None
        )
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
        return self._put(ipc_bytes(sized, ZSTD_1))

    def _held_in(self, batch: pa.RecordBatch) -> tuple[HeldTar, ...]:
        if not self._tars:
            return ()
        paths = pc.struct_field(pc.list_flatten(batch.column(MEMBERS)), "path")
        return self._tars.named(pc.unique(paths).to_pylist())

    def close(self) -> SpilledRows:
        """The split's rows, with their digest (keys and planned sizes: the shards' names)."""
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
