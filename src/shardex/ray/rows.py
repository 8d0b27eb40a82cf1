"""Rows of a table (a Ray block) as scan-table rows, their bytes moved to a data file.

The row conventions are tabled in docs/pipeline.md ("Writing"). Member bytes go to a staged
data object and are referenced by offset, so the driver's scan table holds no sample bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.errors import SourceError
from shardex.refs.members import LABEL_FIELD
from shardex.refs.scan import INVALID, MEMBER_TYPE, MEMBERS, RESERVED
from shardex.storage.base import ObjectWriter

KEY_COLUMNS: Final = ("key", "__key__")
#: Columns of an export's metadata that shardex fills itself: recomputed when writing.
BOOKKEEPING: Final = RESERVED - {"key", "original_path", "split", "label", MEMBERS, INVALID}
_SPECIAL: Final = frozenset({*KEY_COLUMNS, "image", "image_ext", "label", "split", "original_path"})


@dataclass(frozen=True, slots=True)
class Layout:
    """What each column of a row schema is: the key, fields, label, metadata."""

    key: str
    fields: tuple[str, ...]  # binary columns stored as members, in column order
    image: bool  # an ``image`` + ``image_ext`` pair
    label_from_cls: bool
    metadata: tuple[str, ...]


def is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def layout(schema: pa.Schema, where: str) -> Layout:
    """Sort a row schema's columns into key, fields, label and metadata (or SourceError)."""
    names = schema.names
    key = next((k for k in KEY_COLUMNS if k in names), None)
    if key is None:
        raise SourceError(
            f"{where}: rows need a sample key in a 'key' or '__key__' column; found columns {names}"
        )
    image = "image" in names
    if image and "image_ext" not in names:
        raise SourceError(f"{where}: an 'image' column needs an 'image_ext' column beside it")
    label_from_cls = LABEL_FIELD in names and "label" not in names
    rest = [n for n in names if n not in _SPECIAL and n not in BOOKKEEPING]
    metadata = [n for n in rest if not is_binary(schema.field(n).type)]
    scalar_metadata = any(not pa.types.is_nested(schema.field(n).type) for n in metadata)
    skip = {LABEL_FIELD, *(["json"] if scalar_metadata else [])}
    fields = [n for n in rest if is_binary(schema.field(n).type) and n not in skip]
    if not fields and not image:
        raise SourceError(
            f"{where}: rows need encoded data: binary columns named like WebDataset fields "
            f"('jpg', 'png', 'x.npy' ...) or 'image' with 'image_ext'; found columns {names}"
        )
    return Layout(key, tuple(fields), image, label_from_cls, tuple(metadata))


def scan_rows(table: pa.Table, data: ObjectWriter, data_path: str, where: str) -> pa.Table:
    """Scan-table rows of ``table``, member bytes appended to ``data`` (at ``data_path``)."""
    lay = layout(table.schema, where)
    table = table.combine_chunks()
    keys = table.column(lay.key)
    if keys.null_count:
        first = keys.to_pylist().index(None)
        raise SourceError(f"{where}: row {first} of a block has no sample key (null {lay.key!r})")
    keys = keys.cast(pa.string())
    names = table.column_names
    paths = keys
    if "original_path" in names:
        paths = pc.coalesce(table.column("original_path").cast(pa.string()), keys)
    columns: dict[str, Any] = {"key": keys, "original_path": paths}
    columns[MEMBERS] = _members(table, lay, data, data_path)
    for name in names:
        if name == "label":
            columns["label"] = table.column("label").cast(pa.int64())
        elif name == LABEL_FIELD and lay.label_from_cls:
            columns["label"] = _labels(table.column(LABEL_FIELD), where)
        elif name == "split":
            columns["split"] = table.column("split").cast(pa.string())
        elif name in lay.metadata:
            columns[name] = _typed(table.column(name), name, where)
    return pa.table(columns)


def _labels(column: pa.ChunkedArray, where: str) -> pa.Array:
    out: list[int | None] = []
    for value in column.to_pylist():
        try:
            out.append(None if value is None else int(value.strip()))
        except ValueError:
            raise SourceError(f"{where}: 'cls' must hold an integer, got {value!r}") from None
    return pa.array(out, pa.int64())


def _members(table: pa.Table, lay: Layout, data: ObjectWriter, data_path: str) -> pa.Array:
    """One member list per row; each column's bytes are written in one piece."""
    n = table.num_rows
    columns: list[tuple[str, str | None]] = [("image", None)] if lay.image else []
    columns += [(name, name) for name in lay.fields]
    exts = np.empty((len(columns), n), dtype=object)
    offsets = np.zeros((len(columns), n), dtype=np.int64)
    sizes = np.zeros((len(columns), n), dtype=np.int64)
    valid = np.zeros((len(columns), n), dtype=bool)
    for i, (column, ext) in enumerate(columns):
        array = table.column(column).chunk(0) if n else pa.array([], pa.binary())
        offsets[i], sizes[i], valid[i] = _append(array.cast(pa.large_binary()), data)
        if ext is None:
            ext_values = table.column("image_ext").to_pylist()
            if any(v is None for v, ok in zip(ext_values, valid[i], strict=True) if ok):
                raise SourceError("an 'image' needs its 'image_ext' (e.g. 'jpg'); found null")
            exts[i] = [str(v).lower().lstrip(".") if v is not None else "" for v in ext_values]
        else:
            exts[i] = ext
    keep = valid.T.ravel()
    flat = pa.StructArray.from_arrays(
        [
            pa.array(exts.T.ravel()[keep], pa.string()),
            pa.array(np.full(int(keep.sum()), data_path, dtype=object), pa.string()),
            pa.array(offsets.T.ravel()[keep]),
            pa.array(sizes.T.ravel()[keep]),
            pa.nulls(int(keep.sum()), pa.binary()),
        ],
        fields=list(MEMBER_TYPE),
    )
    list_offsets = np.concatenate([[0], np.cumsum(valid.sum(axis=0))]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(list_offsets), flat)


def _append(
    array: pa.LargeBinaryArray, data: ObjectWriter
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Write a binary array's values to ``data``; their offsets, sizes and validity."""
    n = len(array)
    bounds = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + n + 1]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)
    start = data.tell
    values = array.buffers()[2]
    if values is not None and bounds[-1] > bounds[0]:
        # Arrow's buffers are signed chars to memoryview; object stores take unsigned bytes
        data.write(memoryview(values).cast("B")[bounds[0] : bounds[-1]])
    valid = np.ones(n, dtype=bool) if array.null_count == 0 else ~np.asarray(array.is_null())
    return start + bounds[:-1] - bounds[0], np.diff(bounds), valid


def _typed(column: pa.ChunkedArray, name: str, where: str) -> pa.ChunkedArray:
    """Metadata keeps its Arrow type; fixed-shape tensors become fixed-size lists."""
    if not isinstance(column.type, pa.ExtensionType):
        return column
    chunks = []
    for chunk in column.chunks:
        values = chunk.to_numpy() if hasattr(chunk, "to_numpy") else None
        if not isinstance(values, np.ndarray) or values.dtype.kind not in "biuf":
            raise SourceError(
                f"{where}: column {name!r} ({column.type}) cannot be stored as metadata; "
                "use numbers, strings, fixed-shape arrays, or bytes for a sample field"
            )
        chunks.append(_fixed_lists(values))
    return pa.chunked_array(chunks)


def _fixed_lists(values: npt.NDArray[Any]) -> pa.Array:
    """An (N, *shape) array as nested fixed-size lists."""
    out: pa.Array = pa.array(np.ascontiguousarray(values).ravel())
    for size in reversed(values.shape[1:]):
        out = pa.FixedSizeListArray.from_arrays(out, size)
    return out
