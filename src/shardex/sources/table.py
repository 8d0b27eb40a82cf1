"""A Parquet or CSV table: one row per sample, an image path or bytes column, metadata.

Columns are recognised by name (override with the constructor arguments):

* image path: ``image_path``, ``path``, ``file_name``, ``filename``, ``file``, ``image``
  (a string column; relative paths are resolved against the table's folder);
* image bytes: ``image_bytes``, ``image``, ``bytes``, ``jpg``, ``png``, ``webp`` (binary);
* key: ``key``, ``__key__``, ``id``, ``image_id`` (else derived from the path, or the row
  number for bytes);
* label: ``label`` (integers, or strings mapped to sorted ``label_names``);
* split: ``split``.

Every other column is metadata and keeps its type.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Final

import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import sniff
from shardex.errors import EmptySourceError, SourceError, SourceNotFoundError
from shardex.sources.base import (
    ScanResult,
    Source,
    build_table,
    check_metadata_names,
    file_member,
    key_from_relpath,
    safe_key,
)

PATH_COLUMNS: Final = ("image_path", "path", "file_name", "filename", "file", "image")
BYTES_COLUMNS: Final = ("image_bytes", "image", "bytes", "jpg", "png", "webp")
KEY_COLUMNS: Final = ("key", "__key__", "id", "image_id")


def read_table(path: Path) -> pa.Table:
    """Read a Parquet or CSV file into Arrow."""
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if suffix in (".csv", ".tsv"):
            import pyarrow.csv as pcsv

            delimiter = "\t" if suffix == ".tsv" else ","
            return pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter))
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceError(f"cannot read table {path}: {exc}") from exc
    raise SourceError(f"{path}: unsupported table format {suffix!r} (use .parquet or .csv)")


def _pick(table: pa.Table, wanted: str | None, names: tuple[str, ...], kind: Any) -> str | None:
    if wanted is not None:
        if wanted not in table.column_names:
            raise SourceError(
                f"column {wanted!r} is not in the table (columns: {', '.join(table.column_names)})"
            )
        return wanted
    for name in names:
        if name in table.column_names and kind(table.schema.field(name).type):
            return name
    return None


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


class TableSource(Source):
    """Samples listed in a Parquet or CSV file (see the module docstring)."""

    kind: ClassVar[str] = "table"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        path_column: str | None = None,
        bytes_column: str | None = None,
        key_column: str | None = None,
        label_column: str | None = "label",
        label_names: tuple[str, ...] | None = None,
    ) -> None:
        self.path = Path(path).expanduser().absolute()
        self.uri = str(self.path)
        self._path_column = path_column
        self._bytes_column = bytes_column
        self._key_column = key_column
        self._label_column = label_column
        self._label_names = label_names

    def scan(self) -> ScanResult:
        if not self.path.is_file():
            raise SourceNotFoundError(f"source table {self.uri} does not exist")
        table = read_table(self.path)
        if table.num_rows == 0:
            raise EmptySourceError(f"source table {self.uri} has no rows")
        bcol = _pick(table, self._bytes_column, BYTES_COLUMNS, _is_binary)
        pcol = None if bcol else _pick(table, self._path_column, PATH_COLUMNS, _is_string)
        if bcol is None and pcol is None:
            raise SourceError(
                f"source table {self.uri} has no image path column ({', '.join(PATH_COLUMNS)}) "
                f"and no image bytes column ({', '.join(BYTES_COLUMNS)}); name one explicitly"
            )
        kcol = _pick(table, self._key_column, KEY_COLUMNS, lambda t: True)
        used = {c for c in (bcol, pcol, kcol) if c}
        keys, originals, members = self._members(table, pcol, bcol, kcol)
        labels, names = self._labels(table)
        splits = None
        if "split" in table.column_names:
            # a null stays null (refused as "no split"), not a split named "None"
            splits = [None if s is None else str(s) for s in table.column("split").to_pylist()]
            used.add("split")
        if labels is not None and self._label_column:
            used.add(self._label_column)
        meta = table.drop_columns(sorted(used))
        check_metadata_names(meta.column_names, self.uri)
        return ScanResult(
            build_table(keys, originals, members, splits=splits, labels=labels, metadata=meta),
            names,
        )

    def _members(
        self, table: pa.Table, pcol: str | None, bcol: str | None, kcol: str | None
    ) -> tuple[list[str], list[str], list[list[dict[str, Any]]]]:
        n = table.num_rows
        raw_keys = None if kcol is None else [str(k) for k in table.column(kcol).to_pylist()]
        members: list[list[dict[str, Any]]] = []
        if bcol is not None:
            blobs = table.column(bcol).to_pylist()
            width = len(str(n - 1))
            keys = raw_keys or [str(i).zfill(width) for i in range(n)]
            for i, blob in enumerate(blobs):
                if blob is None:
                    raise SourceError(f"{self.uri}: row {i} has no image bytes in {bcol!r}")
                fmt = sniff(blob[:16]) or "bin"
                ext = {"jpeg": "jpg", "tiff": "tif"}.get(fmt, fmt)
                members.append(
                    [{"ext": ext, "path": None, "offset": -1, "size": len(blob), "data": blob}]
                )
            return [safe_key(k) for k in keys], keys, members
        assert pcol is not None
        rels = table.column(pcol).to_pylist()
        keys, originals = [], []
        for i, rel in enumerate(rels):
            if not rel:
                raise SourceError(f"{self.uri}: row {i} has an empty {pcol!r}")
            full = (self.path.parent / rel).absolute()
            try:
                size = full.stat().st_size
            except FileNotFoundError:
                raise SourceNotFoundError(
                    f"{self.uri}: row {i}: image file {full} does not exist"
                ) from None
            ext = full.suffix.lstrip(".").lower() or "bin"
            members.append([file_member(str(full), size, ext)])
            keys.append(safe_key(raw_keys[i]) if raw_keys else key_from_relpath(rel))
            originals.append(rel)
        return keys, originals, members

    def _labels(self, table: pa.Table) -> tuple[list[int | None] | None, tuple[str, ...] | None]:
        col = self._label_column
        if not col or col not in table.column_names:
            return None, self._label_names
        values = table.column(col)
        if pa.types.is_integer(values.type):
            return values.to_pylist(), self._label_names
        if _is_string(values.type) or pa.types.is_dictionary(values.type):
            strings = values.cast(pa.string()) if pa.types.is_dictionary(values.type) else values
            names = self._label_names or tuple(
                sorted(s for s in pc.unique(strings).to_pylist() if s is not None)
            )
            number = {name: i for i, name in enumerate(names)}
            out: list[int | None] = []
            for v in strings.to_pylist():
                if v is not None and v not in number:
                    raise SourceError(f"{self.uri}: label {v!r} is not in label_names")
                out.append(None if v is None else number[v])
            return out, names
        raise SourceError(
            f"{self.uri}: column {col!r} must hold integers or strings, found {values.type}"
        )
