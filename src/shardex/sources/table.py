"""A Parquet or CSV table: one row per sample, an image path or bytes column, metadata.

Columns are recognised by name (override with the constructor arguments):

* image path: ``image_path``, ``path``, ``file_name``, ``filename``, ``file``, ``image``
  (a string column; relative paths are resolved against the table's folder);
* image bytes: ``image_bytes``, ``image``, ``bytes``, ``jpg``, ``png``, ``webp`` (binary);
* key: ``key``, ``__key__``, ``id``, ``image_id`` (else derived from the path, or the row
  number for bytes; when a path is absolute or climbs out with ``..``, keys are the paths
  relative to the common parent folder of all the rows' files, without extension);
* label: ``label`` (integers, or strings mapped to sorted ``label_names``);
* split: ``split``.

Every other column is metadata and keeps its type.

A row that cannot be exported is left out with the reason (refused by default, recorded in
errors.parquet under ``on_error="skip"``): a missing file, a folder, a file that is no
image (by its extension or, for other names, its first bytes), bytes that are no image,
an empty path or no bytes. Bytes and files are then checked like any image (``validate``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import IMAGE_EXTENSIONS, sniff, unexported_image_reason
from shardex.errors import BadSampleError, EmptySourceError, SourceError, SourceNotFoundError
from shardex.sources.base import (
    LeftOut,
    ScanResult,
    Source,
    build_table,
    check_metadata_names,
    check_utf8_path,
    file_member,
    key_from_relpath,
    printable,
    quoted,
    safe_key,
)

PATH_COLUMNS: Final = ("image_path", "path", "file_name", "filename", "file", "image")
BYTES_COLUMNS: Final = ("image_bytes", "image", "bytes", "jpg", "png", "webp")
KEY_COLUMNS: Final = ("key", "__key__", "id", "image_id")


_MISSING: Final = "does not exist"


@dataclass
class _Rows:
    """The rows a table source keeps (by row number), and the rows it leaves out."""

    kept: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    originals: list[str] = field(default_factory=list)
    members: list[list[dict[str, Any]]] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)

    def add(self, row: int, key: str, original: str, member: dict[str, Any]) -> None:
        self.kept.append(row)
        self.keys.append(key)
        self.originals.append(original)
        self.members.append([member])

    def leave_out(
        self,
        key: str,
        reason: str,
        original: str | None = None,
        error: type[SourceError] = BadSampleError,
    ) -> None:
        key = printable(key)
        self.left_out.append(LeftOut(original or key, reason, key, error))


def _keys_from_paths(folder: Path, rels: list[str | None]) -> list[str]:
    """Keys for rows without a key column: each path without its extension, relative to
    the table's folder as written (``imgs/a.jpg`` -> ``imgs/a``).

    When a path is absolute or climbs out with ``..`` (which would make an unsafe key),
    every key is the path relative to the common parent folder of all the rows' files
    instead, as a folder source would name them: the same table always gives the same keys.
    """
    norm = [os.path.normpath(r) if r else "" for r in rels]
    if all(not os.path.isabs(n) and n.split(os.sep, 1)[0] != ".." for n in norm):
        return [key_from_relpath(printable(n)) if n else "" for n in norm]
    full = [os.path.normpath(folder / n) if n else "" for n in norm]
    base = os.path.commonpath([os.path.dirname(f) for f in full if f])
    return [key_from_relpath(printable(os.path.relpath(f, base))) if f else "" for f in full]


def _file_member(full: Path) -> tuple[dict[str, Any] | None, str]:
    """The member of an image file, or None and why it cannot be one.

    A name that is not an image's is accepted when the file's first bytes are an image's
    (its format then names the member); else it would be exported as ``KEY.bin``.
    """
    try:
        st = full.stat()
    except FileNotFoundError:
        return None, _MISSING
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        return None, "is a folder, not an image file"
    if not stat.S_ISREG(st.st_mode):
        return None, "is not a regular file (a FIFO, socket or device)"
    ext = full.suffix.lstrip(".").lower()
    if ext not in IMAGE_EXTENSIONS:
        why = unexported_image_reason(ext)
        if why is not None:
            return None, f"is not exported: {why}"
        try:
            with full.open("rb") as f:
                fmt = sniff(f.read(16))
        except OSError as exc:
            return None, f"cannot be read: {exc.strerror}"
        if fmt is None:
            return None, "is not a recognised image (JPEG, PNG, WebP, GIF, BMP or TIFF)"
        ext = {"jpeg": "jpg", "tiff": "tif"}.get(fmt, fmt)
    return file_member(str(full), st.st_size, ext), ""


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
        check_utf8_path(self.uri)
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
        raw_keys = None if kcol is None else [str(k) for k in table.column(kcol).to_pylist()]
        rows = (
            self._blob_rows(table.column(bcol).to_pylist(), bcol, raw_keys)
            if bcol is not None
            else self._path_rows(table.column(pcol).to_pylist(), str(pcol), raw_keys)
        )
        # label names come from every row: leaving a row out does not renumber the labels
        labels, names = self._labels(table)
        if len(rows.kept) < table.num_rows:
            table = table.take(pa.array(rows.kept, pa.int64()))
            labels = None if labels is None else [labels[i] for i in rows.kept]
        splits = None
        if "split" in table.column_names:
            # a null stays null (refused as "no split"), not a split named "None"
            splits = [None if s is None else str(s) for s in table.column("split").to_pylist()]
            used.add("split")
        if labels is not None and self._label_column:
            used.add(self._label_column)
        meta = table.drop_columns(sorted(used))
        check_metadata_names(meta.column_names, self.uri)
        samples = build_table(
            rows.keys, rows.originals, rows.members, splits=splits, labels=labels, metadata=meta
        )
        return ScanResult(samples, names, tuple(rows.left_out))

    def _blob_rows(self, blobs: list[bytes | None], bcol: str, raw_keys: list[str] | None) -> _Rows:
        """Rows whose image is inline bytes: the format is sniffed from them, and bytes
        that are no image are left out (they would be exported as ``KEY.bin``)."""
        rows = _Rows()
        width = len(str(len(blobs) - 1))
        keys = raw_keys or [str(i).zfill(width) for i in range(len(blobs))]
        for i, blob in enumerate(blobs):
            if blob is None or not blob:
                rows.leave_out(keys[i], f"row {i}: no image bytes in column {bcol!r}")
                continue
            fmt = sniff(blob[:16])
            if fmt is None:
                rows.leave_out(
                    keys[i],
                    f"row {i}: the bytes in column {bcol!r} are not a recognised image "
                    f"(they begin {blob[:8]!r})",
                )
                continue
            ext = {"jpeg": "jpg", "tiff": "tif"}.get(fmt, fmt)
            member = {"ext": ext, "path": None, "offset": -1, "size": len(blob), "data": blob}
            rows.add(i, safe_key(keys[i]), keys[i], member)
        return rows

    def _path_rows(self, rels: list[str | None], pcol: str, raw_keys: list[str] | None) -> _Rows:
        """Rows naming an image file: missing files, folders and files that are no image
        are left out."""
        rows = _Rows()
        keys = raw_keys or _keys_from_paths(self.path.parent, rels)
        for i, rel in enumerate(rels):
            if not rel:
                rows.leave_out(keys[i], f"row {i}: empty {pcol!r}", f"row {i}")
                continue
            full = (self.path.parent / rel).absolute()
            member, why = _file_member(full)
            if member is None:
                missing = why == _MISSING
                rows.leave_out(
                    keys[i],
                    f"row {i}: image file {quoted(str(full))} {why}",
                    printable(rel),
                    SourceNotFoundError if missing else BadSampleError,
                )
                continue
            rows.add(i, safe_key(keys[i]) if raw_keys else keys[i], printable(rel), member)
        return rows

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
