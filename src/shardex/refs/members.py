"""A scan table's members read as flat columns (:class:`Members`): sizes, extensions and
bytes reached by index, not one dict per member (a 20k-sample export spent seconds on
such dicts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.refs.pinned import ArrowBytes, Pinned, is_pinned
from shardex.refs.scan import MEMBER_TYPE, members_array
from shardex.storage import Storage
from shardex.storage.fetch.held import HeldTar
from shardex.storage.fetch.objects import registered

JSON_COLUMN: Final = "_json"

LABEL_FIELD: Final = "cls"  # the class label field, as WebDataset names it


@dataclass(frozen=True, slots=True)
class Members:
    """Every member of some samples: sample ``i`` holds members ``starts[i]:starts[i + 1]``,
    member ``j`` inline ``data[j]`` or ``size[j]`` bytes at ``offset[j]`` (-1: whole) of file or
    URL ``path(j)``. Paths and extensions are dictionary-coded (a million members of one tar
    hold one path); ``data`` stays chunked as it came (no bytes copied).
    """

    starts: npt.NDArray[np.int64]
    ext_codes: npt.NDArray[np.int32]
    ext_names: tuple[str, ...]
    #: -1 where the member has no file (inline bytes).
    path_codes: npt.NDArray[np.int32]
    path_names: tuple[str, ...]
    offset: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    inline: npt.NDArray[np.bool_]
    data: pa.ChunkedArray
    stores: tuple[tuple[str, Storage], ...] = ()
    held: tuple[HeldTar, ...] = ()

    @classmethod
    def of(
        cls,
        column: pa.ChunkedArray | pa.Array,
        stores: tuple[tuple[str, Storage], ...] | None = None,
        held: tuple[HeldTar, ...] = (),
    ) -> Members:
        """Read a ``_members`` column (one pass, no bytes copied). ``stores``: those serving its
        URLs (default: the ones registered here); ``held``: tars that some of them hold.
        """
        if isinstance(column, pa.Array):
            column = pa.chunked_array([column], column.type)
        if len(column) == 0:
            column = pa.chunked_array([pa.array([], pa.list_(MEMBER_TYPE))])
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        starts = np.zeros(len(column) + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        flat = pc.list_flatten(column)

        def field(name: str) -> pa.Array:  # the small fields, joined: no image bytes
            return _joined(pc.struct_field(flat, name))

        data = pc.struct_field(flat, "data").cast(pa.large_binary())  # values not copied
        ext_codes, ext_names = _codes(field("ext"))
        path_codes, path_names = _codes(field("path"))
        remote = any("://" in name for name in path_names)
        return cls(
            starts=starts,
            ext_codes=ext_codes,
            ext_names=ext_names,
            path_codes=path_codes,
            path_names=path_names,
            offset=field("offset").to_numpy(zero_copy_only=False).astype(np.int64),
            size=field("size").to_numpy(zero_copy_only=False).astype(np.int64),
            inline=pc.is_valid(data).to_numpy(zero_copy_only=False),
            data=data,
            stores=(registered() if stores is None else stores) if remote else (),
            held=held if remote else (),
        )

    @classmethod
    def empty(cls) -> Members:
        return cls.of(pa.array([], pa.list_(MEMBER_TYPE)))

    @property
    def num_samples(self) -> int:
        return len(self.starts) - 1

    def ext(self, j: int) -> str:
        return str(self.ext_names[self.ext_codes[j]])

    def path(self, j: int) -> str | None:
        code = self.path_codes[j]
        return None if code < 0 else self.path_names[code]

    def pinned(self, js: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.bool_]:
        """Which members (``js``, default all) are the caller's own buffers (see
        :mod:`shardex.refs.pinned`)."""
        codes = self.path_codes if js is None else self.path_codes[js]
        pinned = [c for c, name in enumerate(self.path_names) if is_pinned(name)]
        return np.isin(codes, pinned) if pinned else np.zeros(len(codes), bool)

    def inline_bytes(self) -> int:
        """Bytes held inline or pinned (in this process's memory)."""
        return int(self.size[self.inline | self.pinned()].sum())

    def mostly_inline(self) -> bool:
        """Whether most of the bytes are inline (an in-memory source)."""
        return self.inline_bytes() * 2 > int(self.size.sum())


def pin_inline(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray | pa.Array, Pinned | None]:
    """A ``_members`` column whose inline bytes are pinned where they lie (none copied): the
    rows then hold references only. None when no member is inline."""
    m = Members.of(column)
    if not m.inline.any():
        return column, None
    pinned = Pinned(ArrowBytes(m.data))
    n = len(m.size)
    codes = np.where(m.inline, len(m.path_names), m.path_codes)
    names = pa.array([*m.path_names, pinned.name], pa.string())
    return members_array(
        m.starts.astype(np.int32),
        pa.array(m.ext_names, pa.string()).take(pa.array(m.ext_codes)),
        names.take(pa.array(codes, mask=codes < 0)),
        np.where(m.inline, np.arange(n, dtype=np.int64), m.offset),
        m.size,
    ), pinned


def _joined(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values


def _codes(values: pa.Array) -> tuple[npt.NDArray[np.int32], tuple[str, ...]]:
    """Dictionary codes of a string array (-1 for null) and its distinct values."""
    encoded = pc.dictionary_encode(values)
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, tuple(encoded.dictionary.to_pylist())


def json_text_column(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """NeMo's ``metadata`` column: each sample's scalar metadata as JSON text (or null)."""
    if JSON_COLUMN in rows.column_names:
        return rows.column(JSON_COLUMN).cast(pa.string())
    return pa.nulls(rows.num_rows, pa.string())
