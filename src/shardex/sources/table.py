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

The table and the files its rows name may be on object storage (``s3://`` URLs, or paths
relative to a table that is itself there; see :mod:`~shardex.sources.tablerows`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import sniff
from shardex.errors import (
    BadSampleError,
    EmptySourceError,
    ObjectNotFoundError,
    SourceError,
    SourceNotFoundError,
)
from shardex.refs.scan import SampleStream, ScanBatch, batch_table
from shardex.sources.base import (
    DEFAULT_BATCH_SIZE,
    Source,
    check_batch_size,
    check_metadata_names,
    check_utf8_path,
    printable,
    quoted,
    safe_key,
)
from shardex.sources.probe import SourceSpec
from shardex.sources.tablefile import TableFile
from shardex.sources.tablerows import (
    MISSING,
    Member,
    Rows,
    common_key_base,
    file_member,
    keys_from_paths,
    object_members,
    pseudo_path,
    url_of,
)
from shardex.storage import open_storage
from shardex.storage.fetch.objects import is_url

PATH_COLUMNS: Final = ("image_path", "path", "file_name", "filename", "file", "image")
BYTES_COLUMNS: Final = ("image_bytes", "image", "bytes", "jpg", "png", "webp")
KEY_COLUMNS: Final = ("key", "__key__", "id", "image_id")


def _pick(schema: pa.Schema, wanted: str | None, names: tuple[str, ...], kind: Any) -> str | None:
    if wanted is not None:
        if wanted not in schema.names:
            raise SourceError(
                f"column {wanted!r} is not in the table (columns: {', '.join(schema.names)})"
            )
        return wanted
    for name in names:
        if name in schema.names and kind(schema.field(name).type):
            return name
    return None


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


@dataclass(frozen=True, slots=True)
class _Plan:
    """How a table's rows become samples: the columns used and what the first pass over
    the label or path column found."""

    bcol: str | None
    pcol: str | None
    kcol: str | None
    label: str | None  # the label column, when it holds labels
    label_names: tuple[str, ...] | None
    key_base: str | None  # see common_key_base
    width: int  # digits of the row numbers that key rows of bytes without a key column


class TableSource(Source):
    """Samples listed in a Parquet or CSV file (see the module docstring)."""

    kind: ClassVar[str] = "table"

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        return cls(spec.location, storage_options=spec.storage_options)  # its paths may be URLs

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        path_column: str | None = None,
        bytes_column: str | None = None,
        key_column: str | None = None,
        label_column: str | None = "label",
        label_names: tuple[str, ...] | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        text = os.fspath(path)
        #: the table's URL when it is on object storage (its path is then the pseudo path
        #: that stands for the URL, see pseudo_path), else None
        self.url = text if is_url(text) else None
        self.path = Path(pseudo_path(text)) if self.url else Path(text).expanduser().absolute()
        self.uri = self.url or str(self.path)
        self.storage_options = storage_options
        self._path_column = path_column
        self._bytes_column = bytes_column
        self._key_column = key_column
        self._label_column = label_column
        self._label_names = label_names
        self.batch_size = check_batch_size(batch_size)

    def stream(self) -> SampleStream:
        if self.url is not None:
            table = self._object_table(self.url)
        elif not self.path.is_file():
            raise SourceNotFoundError(f"source table {self.uri} does not exist")
        else:
            check_utf8_path(self.uri)
            table = TableFile(self.path, self.batch_size)
        if table.num_rows == 0:
            raise EmptySourceError(f"source table {self.uri} has no rows")
        plan = self._plan(table)
        return SampleStream(self._batches(table, plan), plan.label_names)

    def _object_table(self, url: str) -> TableFile:
        """The table at ``url``, fetched whole (one GET)."""
        folder, _, name = url.rpartition("/")
        storage = open_storage(folder, self.storage_options)
        try:
            data = storage.get(name)
        except ObjectNotFoundError as exc:
            raise SourceNotFoundError(f"source table {url} does not exist") from exc
        return TableFile(url, self.batch_size, data)

    def _plan(self, table: TableFile) -> _Plan:
        schema = table.schema
        bcol = _pick(schema, self._bytes_column, BYTES_COLUMNS, _is_binary)
        pcol = None if bcol else _pick(schema, self._path_column, PATH_COLUMNS, _is_string)
        if bcol is None and pcol is None:
            raise SourceError(
                f"source table {self.uri} has no image path column ({', '.join(PATH_COLUMNS)}) "
                f"and no image bytes column ({', '.join(BYTES_COLUMNS)}); name one explicitly"
            )
        kcol = _pick(schema, self._key_column, KEY_COLUMNS, lambda t: True)
        label, names = self._label_plan(table)
        key_base = None
        if pcol is not None and kcol is None:
            column = str(pcol)
            key_base = common_key_base(
                self.path.parent, lambda: (b.column(0) for b in table.batches([column]))
            )
        width = len(str(table.count() - 1)) if bcol is not None and kcol is None else 0
        return _Plan(bcol, pcol, kcol, label, names, key_base, width)

    def _label_plan(self, table: TableFile) -> tuple[str | None, tuple[str, ...] | None]:
        """The label column (None when absent) and the label names: given, or every
        string label of the table, sorted (one pass over that column alone)."""
        col = self._label_column
        if not col or col not in table.schema.names:
            return None, self._label_names
        kind = table.schema.field(col).type
        if pa.types.is_integer(kind):
            return col, self._label_names
        if not (_is_string(kind) or pa.types.is_dictionary(kind)):
            raise SourceError(
                f"{self.uri}: column {col!r} must hold integers or strings, found {kind}"
            )
        if self._label_names:
            return col, self._label_names
        seen: set[str] = set()
        for batch in table.batches([col]):
            unique = pc.unique(_strings(batch.column(0))).to_pylist()
            seen.update(s for s in unique if s is not None)
        return col, tuple(sorted(seen))

    def _batches(self, table: TableFile, plan: _Plan) -> Iterator[ScanBatch]:
        start = 0
        for batch in table.batches():
            yield self._batch(pa.Table.from_batches([batch]), plan, start)
            start += batch.num_rows

    def _batch(self, table: pa.Table, plan: _Plan, start: int) -> ScanBatch:
        used = {c for c in (plan.bcol, plan.pcol, plan.kcol) if c}
        raw_keys = (
            None if plan.kcol is None else [str(k) for k in table.column(plan.kcol).to_pylist()]
        )
        rows = (
            self._blob_rows(table.column(plan.bcol).to_pylist(), plan, raw_keys, start)
            if plan.bcol is not None
            else self._path_rows(table.column(plan.pcol).to_pylist(), plan, raw_keys, start)
        )
        # label names come from every row: leaving a row out does not renumber the labels
        labels = None if plan.label is None else self._labels(table.column(plan.label), plan)
        if len(rows.kept) < table.num_rows:
            table = table.take(pa.array(rows.kept, pa.int64()))
            labels = None if labels is None else labels.take(pa.array(rows.kept, pa.int64()))
        splits = None
        if "split" in table.column_names:
            # a null stays null (refused as "no split"), not a split named "None"
            splits = [None if s is None else str(s) for s in table.column("split").to_pylist()]
            used.add("split")
        if plan.label is not None:
            used.add(plan.label)
        meta = table.drop_columns(sorted(used))
        check_metadata_names(meta.column_names, self.uri)
        samples = batch_table(
            rows.keys, rows.originals, rows.members(), splits=splits, labels=labels, metadata=meta
        )
        return ScanBatch(samples, tuple(rows.left_out))

    def _blob_rows(
        self, blobs: list[bytes | None], plan: _Plan, raw_keys: list[str] | None, start: int
    ) -> Rows:
        """Rows whose image is inline bytes: the format is sniffed from them, and bytes
        that are no image are left out (they would be exported as ``KEY.bin``)."""
        rows = Rows()
        bcol = plan.bcol
        keys = raw_keys or [str(start + i).zfill(plan.width) for i in range(len(blobs))]
        for i, blob in enumerate(blobs):
            if blob is None or not blob:
                rows.leave_out(keys[i], f"row {start + i}: no image bytes in column {bcol!r}")
                continue
            fmt = sniff(blob[:16])
            if fmt is None:
                rows.leave_out(
                    keys[i],
                    f"row {start + i}: the bytes in column {bcol!r} are not a recognised image "
                    f"(they begin {blob[:8]!r})",
                )
                continue
            ext = {"jpeg": "jpg", "tiff": "tif"}.get(fmt, fmt)
            rows.add(i, safe_key(keys[i]), keys[i], Member(ext, len(blob), data=blob))
        return rows

    def _path_rows(
        self, rels: list[str | None], plan: _Plan, raw_keys: list[str] | None, start: int
    ) -> Rows:
        """Rows naming an image file: missing files, folders and files that are no image
        are left out."""
        rows = Rows()
        written = rels
        rels = [pseudo_path(r) if r and is_url(r) else r for r in rels]
        keys = raw_keys or keys_from_paths(self.path.parent, rels, plan.key_base)
        fulls = [(self.path.parent / r).absolute() if r else None for r in rels]
        urls = {
            i: url_of(os.path.normpath(full))
            for i, full in enumerate(fulls)
            if full is not None and (self.url is not None or is_url(written[i] or ""))
        }
        found = object_members(urls, self.storage_options)
        for i, rel in enumerate(written):
            full = fulls[i]
            if not rel or full is None:
                rows.leave_out(keys[i], f"row {start + i}: empty {plan.pcol!r}", f"row {start + i}")
                continue
            member, why = found[i] if i in found else file_member(full)
            if member is None:
                missing = why == MISSING
                kind = "object" if i in urls else "image file"
                rows.leave_out(
                    keys[i],
                    f"row {start + i}: {kind} {quoted(urls.get(i) or str(full))} {why}",
                    printable(rel),
                    SourceNotFoundError if missing else BadSampleError,
                )
                continue
            rows.add(i, safe_key(keys[i]) if raw_keys else keys[i], printable(rel), member)
        return rows

    def _labels(self, values: pa.ChunkedArray, plan: _Plan) -> pa.Array:
        """A batch's class numbers."""
        if pa.types.is_integer(values.type):
            return values.combine_chunks().cast(pa.int64())
        assert plan.label_names is not None
        strings = _strings(values)
        number = pc.index_in(strings, value_set=pa.array(plan.label_names, pa.string()))
        unknown = pc.and_(strings.is_valid(), number.is_null())
        if pc.any(unknown).as_py():
            v = strings.filter(unknown)[0].as_py()
            raise SourceError(f"{self.uri}: label {v!r} is not in label_names")
        return number.cast(pa.int64())


def _strings(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values.cast(pa.string()) if pa.types.is_dictionary(values.type) else values
