"""A Parquet or CSV table as a source: one row per sample, an image path or bytes column
(names in ``*_COLUMNS``), keys, labels, and metadata. Rows that cannot be exported are
left out with the reason. Table and files may be on object storage: a URL is worked on as
a pseudo absolute path (``s3://b/x.jpg`` -> ``/s3:/b/x.jpg``), so the path rules apply.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import IMAGE_EXTENSIONS, sniffed_extension, unexported_image_reason
from shardex.errors import (
    BadSampleError,
    EmptySourceError,
    ObjectNotFoundError,
    SourceError,
    SourceNotFoundError,
)
from shardex.refs.scan import LeftOut, SampleStream, ScanBatch, batch_table, members_array
from shardex.sources.base import (
    DEFAULT_BATCH_SIZE,
    Source,
    check_batch_size,
    check_metadata_names,
    check_utf8_path,
    key_from_relpath,
    printable,
    quoted,
    safe_key,
)
from shardex.sources.probe import SourceSpec
from shardex.sources.tablefile import TableFile
from shardex.storage import Storage, open_storage
from shardex.storage.fetch.objects import MAX_IN_FLIGHT, is_url, register, split_url

PATH_COLUMNS: Final = ("image_path", "path", "file_name", "filename", "file", "image")
BYTES_COLUMNS: Final = ("image_bytes", "image", "bytes", "jpg", "png", "webp")
KEY_COLUMNS: Final = ("key", "__key__", "id", "image_id")

#: Why a row's file or object cannot be a member when it is not there.
MISSING: Final = "does not exist"


@dataclass(frozen=True, slots=True)
class Member:
    """A row's member: a whole file, an object (``path`` its URL), or inline bytes."""

    ext: str
    size: int
    path: str | None = None
    data: bytes | None = None


def pseudo_path(url: str) -> str:
    """The absolute path standing for a URL: ``s3://b/x.jpg`` -> ``/s3:/b/x.jpg``."""
    scheme, _, rest = url.partition("://")
    return f"/{scheme}:/{rest}"


def url_of(pseudo: str) -> str | None:
    """The URL a pseudo path stands for (None when it climbed out of its bucket)."""
    scheme, _, rest = pseudo.lstrip("/").partition(":/")
    url = f"{scheme}://{rest}"
    return url if is_url(url) and "/" in rest and "/" not in scheme else None


@dataclass
class _Rows:
    """The rows of a batch a table source keeps (by row number), and those it leaves out."""

    kept: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    originals: list[str] = field(default_factory=list)
    ext: list[str] = field(default_factory=list)
    path: list[str | None] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    data: list[bytes] | None = None
    left_out: list[LeftOut] = field(default_factory=list)

    def add(self, row: int, key: str, original: str, member: Member) -> None:
        self.kept.append(row)
        self.keys.append(key)
        self.originals.append(original)
        self.ext.append(member.ext)
        self.path.append(member.path)
        self.size.append(member.size)
        if member.data is not None:
            self.data = self.data or []
            self.data.append(member.data)

    def members(self) -> pa.Array:
        n = len(self.kept)
        return members_array(
            np.arange(n + 1, dtype=np.int32),
            self.ext,
            self.path,
            np.full(n, -1, np.int64),
            self.size,
            self.data,
        )

    def leave_out(
        self,
        key: str,
        reason: str,
        original: str | None = None,
        error: type[SourceError] = BadSampleError,
    ) -> None:
        key = printable(key)
        self.left_out.append(LeftOut(original or key, reason, key, error))


def _key_base(folder: Path, rels: Callable[[], Iterator[pa.Array]]) -> str | None:
    """None when every path is relative and stays below the table's folder, else the common
    parent of all the rows' files: keys never climb out, and one table always gives one set.
    """

    def norm() -> Iterator[str]:
        for chunk in rels():
            yield from (
                os.path.normpath(pseudo_path(r) if is_url(r) else r) for r in chunk.to_pylist() if r
            )

    if all(not os.path.isabs(n) and n.split(os.sep, 1)[0] != ".." for n in norm()):
        return None
    base: str | None = None
    for n in norm():  # pairwise, not one list: a table may have millions of rows
        parent = os.path.dirname(os.path.normpath(folder / n))
        base = parent if base is None else os.path.commonpath([base, parent])
    return base


def _keys_from_paths(folder: Path, rels: list[str | None], base: str | None) -> list[str]:
    norm = [os.path.normpath(r) if r else "" for r in rels]
    if base is None:
        return [key_from_relpath(printable(n)) if n else "" for n in norm]
    full = [os.path.normpath(folder / n) if n else "" for n in norm]
    return [key_from_relpath(printable(os.path.relpath(f, base))) if f else "" for f in full]


def _member(ext: str, size: int, path: str, head: Callable[[], bytes]) -> tuple[Member | None, str]:
    """The member of a file or object named ``ext`` (else sniffed: ``head()``), or None and why."""
    if ext not in IMAGE_EXTENSIONS:
        why = unexported_image_reason(ext)
        if why is not None:
            return None, f"is not exported: {why}"
        sniffed = sniffed_extension(head())
        if sniffed is None:
            return None, "is not a recognised image (JPEG, PNG, WebP, GIF, BMP or TIFF)"
        ext = sniffed
    return Member(ext, size, path=path), ""


def _head(full: Path) -> bytes:
    with full.open("rb") as f:
        return f.read(16)


def _file_member(full: Path) -> tuple[Member | None, str]:
    try:
        st = full.stat()
    except FileNotFoundError:
        return None, MISSING
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        return None, "is a folder, not an image file"
    if not stat.S_ISREG(st.st_mode):
        return None, "is not a regular file (a FIFO, socket or device)"
    try:
        ext = full.suffix.lstrip(".").lower()
        return _member(ext, st.st_size, str(full), lambda: _head(full))
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"


def _object_members(
    urls: dict[int, str | None], options: dict[str, Any] | None
) -> dict[int, tuple[Member | None, str]]:
    """The members of rows naming objects (one HEAD each, concurrently), or why not."""
    if not urls:
        return {}
    stores: dict[str, Storage] = {}
    for url in urls.values():
        if url is not None:
            bucket = split_url(url)[0]
            if bucket not in stores:
                stores[bucket] = open_storage(bucket, options)
                register(stores[bucket])

    def one(url: str | None) -> tuple[Member | None, str]:
        if url is None:
            return None, "climbs out of its bucket with '..'"
        bucket, path = split_url(url)
        storage = stores[bucket]
        try:
            size = storage.size(path)
        except ObjectNotFoundError:
            return None, MISSING
        name = path.rpartition("/")[2]
        ext = name.rpartition(".")[2].lower() if "." in name else ""
        return _member(ext, size, url, lambda: storage.get_range(path, 0, 16) if size else b"")

    with ThreadPoolExecutor(MAX_IN_FLIGHT, "shardex-source-head") as pool:
        return dict(zip(urls, pool.map(one, urls.values()), strict=True))


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
    bcol: str | None
    pcol: str | None
    kcol: str | None
    label: str | None
    label_names: tuple[str, ...] | None
    key_base: str | None
    width: int  # digits of the row-number keys of bytes rows


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
            key_base = _key_base(
                self.path.parent, lambda: (b.column(0) for b in table.batches([column]))
            )
        width = len(str(table.count() - 1)) if bcol is not None and kcol is None else 0
        return _Plan(bcol, pcol, kcol, label, names, key_base, width)

    def _label_plan(self, table: TableFile) -> tuple[str | None, tuple[str, ...] | None]:
        """The label column (or None) and its names: given, or the sorted string labels."""
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
        used = {c for c in (plan.bcol, plan.pcol, plan.kcol, plan.label) if c}
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
        meta = table.drop_columns(sorted(used))
        check_metadata_names(meta.column_names, self.uri)
        samples = batch_table(
            rows.keys, rows.originals, rows.members(), splits=splits, labels=labels, metadata=meta
        )
        return ScanBatch(samples, tuple(rows.left_out))

    def _blob_rows(
        self, blobs: list[bytes | None], plan: _Plan, raw_keys: list[str] | None, start: int
    ) -> _Rows:
        """Rows of inline bytes; bytes that are no image are left out (not made ``KEY.bin``)."""
        rows = _Rows()
        bcol = plan.bcol
        keys = raw_keys or [str(start + i).zfill(plan.width) for i in range(len(blobs))]
        for i, blob in enumerate(blobs):
            if not blob:
                rows.leave_out(keys[i], f"row {start + i}: no image bytes in column {bcol!r}")
                continue
            ext = sniffed_extension(blob[:16])
            if ext is None:
                rows.leave_out(
                    keys[i],
                    f"row {start + i}: the bytes in column {bcol!r} are not a recognised image "
                    f"(they begin {blob[:8]!r})",
                )
                continue
            rows.add(i, safe_key(keys[i]), keys[i], Member(ext, len(blob), data=blob))
        return rows

    def _path_rows(
        self, rels: list[str | None], plan: _Plan, raw_keys: list[str] | None, start: int
    ) -> _Rows:
        rows = _Rows()
        written = rels
        rels = [pseudo_path(r) if r and is_url(r) else r for r in rels]
        keys = raw_keys or _keys_from_paths(self.path.parent, rels, plan.key_base)
        fulls = [(self.path.parent / r).absolute() if r else None for r in rels]
        urls = {
            i: url_of(os.path.normpath(full))
            for i, full in enumerate(fulls)
            if full is not None and (self.url is not None or is_url(written[i] or ""))
        }
        found = _object_members(urls, self.storage_options)
        for i, rel in enumerate(written):
            full = fulls[i]
            if not rel or full is None:
                rows.leave_out(keys[i], f"row {start + i}: empty {plan.pcol!r}", f"row {start + i}")
                continue
            member, why = found[i] if i in found else _file_member(full)
            if member is None:
                kind = "object" if i in urls else "image file"
                rows.leave_out(
                    keys[i],
                    f"row {start + i}: {kind} {quoted(urls.get(i) or str(full))} {why}",
                    printable(rel),
                    SourceNotFoundError if why == MISSING else BadSampleError,
                )
                continue
            rows.add(i, safe_key(keys[i]) if raw_keys else keys[i], printable(rel), member)
        return rows

    def _labels(self, values: pa.ChunkedArray, plan: _Plan) -> pa.Array:
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
