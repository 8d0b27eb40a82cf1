"""The scan table every source yields, one row per sample: ``key``, ``original_path``,
optional ``split`` and ``label``, ``_members`` (:data:`MEMBER_TYPE`: byte ranges of files,
object URLs or inline bytes, read only when shards are written), optional ``_invalid``
(why a sample cannot be used), then metadata. Only this package names ``_members``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final, TypedDict

import numpy as np
import pyarrow as pa

from shardex.errors import BadSampleError, SourceError
from shardex.quoting import quoted

MEMBERS: Final = "_members"
MAX_INLINE_BYTES: Final = 1 << 30  # per piece: well inside 32-bit binary offsets
INVALID: Final = "_invalid"
MEMBER_TYPE: Final[pa.StructType] = pa.struct(
    [
        ("ext", pa.string()),
        ("path", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("data", pa.binary()),
    ]
)


class MemberRow(TypedDict):
    """One member of a ``_members`` list as ``to_pylist`` gives it (see :data:`MEMBER_TYPE`)."""

    ext: str
    path: str | None
    offset: int
    size: int
    data: bytes | None


#: Columns shardex fills itself: not for a source's metadata.
RESERVED: Final = frozenset(
    {
        "key",
        "image_id",
        "tar_file",
        "member_name",
        "original_path",
        "metadata",
        "split",
        "export_index",
        "label",
        "sample_index",
        "sample_offset",
        "sample_length",
        "sample_checksum",
        MEMBERS,
        INVALID,
    }
)


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A file, folder or row a source found but cannot export, and why.

    ``original_path`` and ``key`` are printable: they go into errors.parquet and one-line
    messages; ``error`` is what refusing it raises.
    """

    original_path: str
    reason: str
    key: str = ""
    error: type[SourceError] = BadSampleError

    def record(self) -> dict[str, str]:
        """Its errors.parquet row."""
        return {"key": self.key, "original_path": self.original_path, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a scan found: the sample table, the label names, and what it cannot export."""

    table: pa.Table
    label_names: tuple[str, ...] | None = None
    left_out: tuple[LeftOut, ...] = ()


@dataclass(frozen=True, slots=True)
class ScanBatch:
    """Some of a source's samples (scan-table rows) and what it left out finding them."""

    table: pa.Table
    left_out: tuple[LeftOut, ...] = ()


@dataclass(frozen=True, slots=True)
class SampleStream:
    """A source's samples, batch by batch, as it finds them; ``label_names`` known first.
    Metadata columns may differ between batches and widen from int to float: consumers join
    batches with Arrow's permissive promotion.
    """

    batches: Iterator[ScanBatch]
    label_names: tuple[str, ...] | None = None


def batch_types_error(uri: str, exc: Exception) -> SourceError:
    """The error for batches whose columns' types cannot be joined."""
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return SourceError(
        f"source {quoted(uri)} gives a column different types in different batches "
        f"({quoted(why)}); give each column one type (or types that widen: int to float)"
    )


def file_member(path: str, size: int, ext: str) -> dict[str, Any]:
    """A member that is a whole local file."""
    return {"ext": ext, "path": path, "offset": -1, "size": size, "data": None}


def members_array(
    offsets: Any, ext: Any, path: Any, offset: Any, size: Any, data: Any = None
) -> pa.Array | pa.ChunkedArray:
    """The ``_members`` column built column by column (no dict per member); ``offsets`` (n + 1)
    locate each sample's members in the flat columns. Inline bytes past
    :data:`MAX_INLINE_BYTES` come back as a ChunkedArray of whole samples.
    """
    if isinstance(data, list):
        cuts = _inline_cuts(offsets, data)
        if len(cuts) > 2:
            at = np.asarray(offsets, np.int64)
            pieces = []
            for a, b in pairwise(cuts):
                lo, hi = int(at[a]), int(at[b])
                flat = [None if v is None else v[lo:hi] for v in (ext, path, offset, size, data)]
                pieces.append(_members(at[a : b + 1] - lo, *flat))
            return pa.chunked_array(pieces, pa.list_(MEMBER_TYPE))
    return _members(offsets, ext, path, offset, size, data)


def _inline_cuts(offsets: Any, data: list[bytes | None]) -> list[int]:
    """Sample numbers cutting a batch into pieces of at most :data:`MAX_INLINE_BYTES` (0 ... n)."""
    sizes = np.fromiter((0 if d is None else len(d) for d in data), np.int64, len(data))
    before = np.concatenate([[0], np.cumsum(sizes)])[np.asarray(offsets, np.int64)]
    samples = len(before) - 1
    cuts = [0]
    if before[-1] > MAX_INLINE_BYTES:  # rare: only then a loop over the samples
        for s in range(1, samples):
            if before[s + 1] - before[cuts[-1]] > MAX_INLINE_BYTES:
                cuts.append(s)
    return [*cuts, samples]


def _members(offsets: Any, ext: Any, path: Any, offset: Any, size: Any, data: Any) -> pa.Array:
    flat = len(ext)
    children = [
        _as_array(ext, pa.string()),
        pa.nulls(flat, pa.string()) if path is None else _as_array(path, pa.string()),
        _as_array(offset, pa.int64()),
        _as_array(size, pa.int64()),
        pa.nulls(flat, pa.binary()) if data is None else _as_array(data, pa.binary()),
    ]
    struct = pa.StructArray.from_arrays(children, fields=list(MEMBER_TYPE))
    return pa.ListArray.from_arrays(_as_array(offsets, pa.int32()), struct)


def _as_array(values: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values if values.type == type_ else values.cast(type_)
    return pa.array(values, type_)


def batch_table(
    keys: Any,
    original_paths: Any,
    members: pa.Array | pa.ChunkedArray,
    *,
    splits: Any = None,
    labels: Any = None,
    metadata: pa.Table | None = None,
    invalid: Any = None,
) -> pa.Table:
    """Assemble a scan table from columns (lists or Arrow arrays) and a ``_members`` column."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        "key": _as_array(keys, pa.string()),
        "original_path": _as_array(original_paths, pa.string()),
    }
    if splits is not None:
        columns["split"] = _as_array(splits, pa.string())
    if labels is not None:
        columns["label"] = _as_array(labels, pa.int64())
    columns[MEMBERS] = members
    if invalid is not None:
        invalid = _as_array(invalid, pa.string())
        if invalid.null_count < len(invalid):
            columns[INVALID] = invalid
    table = pa.table(columns)
    if metadata is not None:
        for name in metadata.column_names:
            table = table.append_column(name, metadata.column(name))
    return table


def build_table(
    keys: list[str],
    original_paths: list[str],
    members: list[list[dict[str, Any]]] | pa.Array,
    *,
    splits: Sequence[str | None] | None = None,
    labels: list[int | None] | None = None,
    metadata: pa.Table | None = None,
    invalid: list[str | None] | None = None,
) -> pa.Table:
    """Assemble a scan table from per-sample lists (and optional metadata columns)."""
    return batch_table(
        keys,
        original_paths,
        members if isinstance(members, pa.Array) else pa.array(members, pa.list_(MEMBER_TYPE)),
        splits=splits,
        labels=labels,
        metadata=metadata,
        invalid=invalid,
    )
