"""Sample references spilled to local scratch, split by split, so that no process holds a
whole dataset's references.

Pass 1 appends each batch's rows of a split to a :class:`Spill` (Arrow IPC streams, a new
segment when a batch's columns differ from the one before: a source's batches may); the
planning pass reads them back in order and writes each split's final rows with
:class:`FinalSpill`, an IPC file of small record batches that a shard job reads a slice
of (see :class:`shardex.rows.SpillSlice`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

from shardex.rows import SizesFile, SpilledRows

#: Rows per record batch of a final spill: a shard job reads whole batches, so they are
#: about a shard's size (a job of 1,000 candidates reads 1-2 batches).
FINAL_BATCH_ROWS: Final = 1024
#: Spill files are mostly repeated paths and extensions: zstd (level 1) makes them about
#: 5x smaller for little CPU (2.3x smaller than lz4, as fast to write; measured on
#: object-store references): the scratch bytes this process writes and reads back.
_OPTIONS: Final = pa.ipc.IpcWriteOptions(
    compression=pa.Codec("zstd", 1) if pa.Codec.is_available("zstd") else None
)


class Spill:
    """Rows appended in order, read back in the same order (one split's rows of pass 1)."""

    def __init__(self, folder: Path, name: str) -> None:
        self._folder, self._name = folder, name
        self._segments: list[Path] = []
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema: pa.Schema | None = None
        self.num_rows = 0

    def append(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None or not table.schema.equals(self._schema):
            self._close_writer()
            path = self._folder / f"{self._name}-{len(self._segments):04d}.arrows"
            self._segments.append(path)
            self._schema = table.schema
            self._writer = pa.ipc.new_stream(str(path), table.schema, options=_OPTIONS)
        self._writer.write_table(table)
        self.num_rows += table.num_rows

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def tables(self) -> Iterator[pa.Table]:
        """The rows appended, in order, a batch at a time."""
        self._close_writer()
        for path in self._segments:
            with pa.OSFile(str(path)) as f:
                for batch in pa.ipc.open_stream(f):
                    yield pa.Table.from_batches([batch])

    def remove(self) -> None:
        self._close_writer()
        for path in self._segments:
            path.unlink(missing_ok=True)


class FinalSpill:
    """A split's final candidate rows (one schema) and their planned sizes, written in
    order; :meth:`close` gives the :class:`SpilledRows` that shard jobs slice."""

    def __init__(self, folder: Path, name: str, schema: pa.Schema) -> None:
        self._path = folder / f"{name}.arrow"
        self._sizes_path = folder / f"{name}.sizes"
        self._writer = pa.ipc.new_file(str(self._path), schema, options=_OPTIONS)
        self._sizes = open(self._sizes_path, "wb")  # noqa: SIM115  # closed in close()
        self._starts = [0]
        self._digest = xxhash.xxh3_128()

    def append(self, table: pa.Table, sizes: npt.NDArray[np.int64]) -> None:
        for batch in table.to_batches(max_chunksize=FINAL_BATCH_ROWS):
            if batch.num_rows:
                self._writer.write_batch(batch)
                self._starts.append(self._starts[-1] + batch.num_rows)
        self._sizes.write(sizes.astype("<i8").tobytes())
        keys = "\n".join(table.column("key").to_pylist())
        self._digest.update((keys if self._starts[-1] == table.num_rows else "\n" + keys).encode())

    def close(self) -> SpilledRows:
        """The split's rows; their content digest is :func:`shardex.planning.content_digest`'s
        (the keys, then the sizes), computed as they were written."""
        self._writer.close()
        self._sizes.close()
        with open(self._sizes_path, "rb") as f:
            while chunk := f.read(1 << 20):
                self._digest.update(chunk)
        n = self._starts[-1]
        return SpilledRows(
            str(self._path),
            np.array(self._starts, np.int64),
            SizesFile(str(self._sizes_path), 0, n),
            str(self._digest.hexdigest()),
        )
