"""A Parquet or CSV file read in batches, a pass at a time: Parquet through the fragment
reader ``pq.read_table`` uses (same types and messages), CSV typed from its first block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from shardex.errors import SourceError

__all__ = ["TableFile"]


class TableFile:
    """A Parquet or CSV file read in batches; ``data``: its bytes if fetched from object storage."""

    def __init__(self, path: Path | str, batch_size: int, data: bytes | None = None) -> None:
        self.path = path
        self.batch_size = batch_size
        self._data = data
        suffix = "." + str(path).rpartition(".")[2] if "." in str(path) else ""
        suffix = suffix.lower()
        if suffix not in (".parquet", ".pq", ".csv", ".tsv"):
            raise SourceError(f"{path}: unsupported table format {suffix!r} (use .parquet or .csv)")
        self.parquet = suffix in (".parquet", ".pq")
        self.delimiter = "\t" if suffix == ".tsv" else ","
        with self._errors():
            if self.parquet:
                import pyarrow.dataset as pds
                from pyarrow.fs import LocalFileSystem

                # what pq.read_table reads a file through: the same types, the same messages
                self._file = (
                    pds.ParquetFileFormat().make_fragment(str(path), LocalFileSystem())
                    if data is None
                    else pds.ParquetFileFormat().make_fragment(pa.BufferReader(data))
                )
                self.schema: pa.Schema = self._file.physical_schema
                self.num_rows: int | None = self._file.count_rows()
            else:
                with self._csv(None) as reader:
                    self.schema = reader.schema
                    self.num_rows = None if any(b.num_rows for b in reader) else 0

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"cannot read table {self.path}: {exc}") from exc

    def _csv(self, columns: list[str] | None) -> Any:
        import pyarrow.csv as pcsv

        return pcsv.open_csv(
            self.path if self._data is None else pa.BufferReader(self._data),
            parse_options=pcsv.ParseOptions(delimiter=self.delimiter),
            # the types inferred from the first block apply to every column read alone
            convert_options=pcsv.ConvertOptions(
                include_columns=columns, column_types=None if columns is None else self.schema
            ),
        )

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The rows in batches of at most ``batch_size`` (only ``columns`` if given)."""
        with self._errors():
            if self.parquet:
                yield from self._file.to_batches(columns=columns, batch_size=self.batch_size)
                return
            with self._csv(columns) as reader:
                for block in reader:
                    for start in range(0, block.num_rows, self.batch_size):
                        yield block.slice(start, self.batch_size)

    def count(self) -> int:
        if self.num_rows is None:
            self.num_rows = sum(b.num_rows for b in self.batches([self.schema.names[0]]))
        return self.num_rows
