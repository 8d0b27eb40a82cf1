"""A split's metadata as the browser reads it: the light columns at once, the heavy ones
when asked (``Dataset.metadata`` decodes all: half a GB at 1M samples with embeddings).
"""

from __future__ import annotations

import threading
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardex.contract import METADATA_FILE, ExportConfig
from shardex.format.tables import arrow_reader, checked_file, metadata_errors
from shardex.storage.base import Storage

#: Columns of every export that copy what the sample page shows otherwise.
COPIES: Final = frozenset({"metadata", "image_id", "tar_file", "member_name"})


def is_heavy(field: pa.Field) -> bool:
    """Whether a column is decoded only when asked (lists, nested values, copies)."""
    kind = field.type
    nested = pa.types.is_nested(kind) or pa.types.is_binary(kind)
    return field.name in COPIES or nested or pa.types.is_large_binary(kind)


class SplitTable:
    """The metadata rows of one split, in sample order (thread-safe)."""

    def __init__(self, storage: Storage, config: ExportConfig, split: str) -> None:
        name = config.metadata_file or METADATA_FILE
        self.where = storage.join(name)
        data = checked_file(storage, name, config.metadata_checksum)
        self._lock = threading.Lock()
        with metadata_errors(self.where):
            self._file = pq.ParquetFile(arrow_reader(data))
            self.schema: pa.Schema = self._file.schema_arrow
            light = [f.name for f in self.schema if not is_heavy(f)]
            table = self._file.read(columns=light)
        self.rows = _split_rows(table, split)  # file row of each sample of the split
        everything = len(self.rows) == table.num_rows and bool(
            np.all(self.rows == np.arange(len(self.rows)))
        )
        self.table = table if everything else table.take(pa.array(self.rows))
        self._starts = np.cumsum(
            [0]
            + [self._file.metadata.row_group(g).num_rows for g in range(self._file.num_row_groups)]
        )
        self._columns: dict[str, pa.ChunkedArray] = {}

    @property
    def heavy(self) -> list[str]:
        return [f.name for f in self.schema if is_heavy(f)]

    def column(self, name: str) -> pa.ChunkedArray:
        """One column for every sample of the split (a heavy one is decoded once)."""
        if name in self.table.column_names:
            return self.table.column(name)
        with self._lock:
            if name not in self._columns:
                with metadata_errors(self.where):
                    whole = self._file.read(columns=[name]).column(name)
                self._columns[name] = whole.take(pa.array(self.rows))
            return self._columns[name]

    def row(self, index: int) -> dict[str, Any]:
        """Every column's value for sample ``index``, in the file's column order."""
        values: dict[str, Any] = self.table.slice(index, 1).to_pylist()[0]
        heavy = self.heavy
        if heavy:
            file_row = int(self.rows[index])
            group = int(np.searchsorted(self._starts, file_row, side="right")) - 1
            with self._lock, metadata_errors(self.where):
                part = self._file.read_row_group(group, columns=heavy)
            values.update(part.slice(file_row - int(self._starts[group]), 1).to_pylist()[0])
        return {name: values[name] for name in self.schema.names}


def _split_rows(table: pa.Table, split: str) -> npt.NDArray[np.int64]:
    """File rows of ``split``, ordered by sample number (as ``Dataset.metadata``)."""
    names = table.column_names
    if "split" in names:
        chosen = pc.fill_null(pc.equal(table.column("split"), split), False)
        rows = np.flatnonzero(np.asarray(chosen.to_numpy(), dtype=bool))
    else:
        rows = np.arange(table.num_rows)
    if "sample_index" in names:
        numbers = table.column("sample_index").to_numpy()[rows]
        if numbers.size and not bool(np.all(numbers[1:] > numbers[:-1])):
            rows = rows[np.argsort(numbers, kind="stable")]
    return rows.astype(np.int64)
