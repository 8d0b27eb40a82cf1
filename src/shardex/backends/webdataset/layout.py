"""The tar layout of a shard's candidates, built for all of them at once with numpy.

Every byte that is not a source member's (headers, padding, ``KEY.cls``, ``KEY.json``) is
laid out in one zeroed *skeleton*, where each header starts a block (so headers go in as
rows of one ``(n, 512)`` array). The tar is then skeleton runs interleaved with the
members' own buffers, taken as views, never copied.
"""

from __future__ import annotations

import threading
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.format.tar import BLOCK, header_blocks, long_headers, member_header
from shardex.refs.candidates import Candidates
from shardex.refs.members import JSON_COLUMN, LABEL_FIELD, Members

Ints = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]

_REUSED_BYTES: Final = 16 << 20
_scratch = threading.local()


def zeroed(size: int) -> Bytes:
    """``size`` zero bytes: the thread's buffer when no view of it is left (a held
    bytearray cannot resize: the test), else fresh memory. Fresh memory's page faults
    cost more than building the skeleton."""
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if size > _REUSED_BYTES:
        return np.zeros(size, np.uint8)
    if buf is not None:
        try:
            buf.append(0)
            del buf[-1]
        except BufferError:  # a view of the last skeleton is still held
            buf = None
    if buf is None or len(buf) < size:
        buf = bytearray(max(size, 1 << 20))
        _scratch.buf = buf
    out = np.frombuffer(buf, np.uint8, size)
    out[:] = 0
    return out


def spread(starts: Ints, lengths: Ints) -> Ints:
    """A ragged arange: ``starts[i] .. starts[i] + lengths[i]`` of every ``i``, back to back."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return np.arange(total, dtype=np.int64) - np.repeat(ends - lengths - starts, lengths)


def binary_buffers(values: pa.Array) -> tuple[Bytes, Ints]:
    """The bytes and offsets of a large_binary or large_string array."""
    n = len(values)
    buffers = values.buffers()
    if buffers[1] is None:
        return np.zeros(0, np.uint8), np.zeros(n + 1, np.int64)
    offsets = np.frombuffer(buffers[1], np.int64)[values.offset : values.offset + n + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return data, offsets


def string_array(data: Bytes, offsets: Ints) -> pa.Array:
    """A large_string array over UTF-8 bytes and offsets."""
    n = len(offsets) - 1
    return pa.Array.from_buffers(
        pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def gathered(data: Bytes, offsets: Ints, which: Ints) -> tuple[Bytes, Ints]:
    """The values ``which`` of ``(data, offsets)``, back to back."""
    lengths = offsets[which + 1] - offsets[which]
    out = np.zeros(len(which) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return data[spread(offsets[which], lengths)], out


def int_array(values: npt.NDArray[Any], kind: pa.DataType) -> pa.Array:
    """An Arrow array over a numpy array's memory (``pa.array`` would import pandas)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def member_bytes(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as member bytes (null: no member): bytes, UTF-8, digits, else ``str()``."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = values.type
    if pa.types.is_integer(kind):
        values = pc.cast(values, pa.string())  # the digits str() writes
    elif not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        texts = [v if v is None or isinstance(v, bytes) else str(v).encode() for v in values]
        values = pa.array(np.array(texts, dtype=object), pa.binary())
    return values.cast(pa.large_binary())


def _extra_columns(rows: pa.Table, with_label: bool) -> list[tuple[str, pa.Array]]:
    """The members the writer adds (``cls``, ``json``) and their bytes per candidate."""
    out: list[tuple[str, pa.Array]] = []
    if with_label:
        out.append((LABEL_FIELD, member_bytes(rows.column("label"))))
    if JSON_COLUMN in rows.column_names:
        out.append(("json", member_bytes(rows.column(JSON_COLUMN))))
    return out


class ShardLayout:
    """The tar members of a shard's candidates as arrays over every member, and the
    skeleton."""

    def __init__(self, candidates: Candidates, with_label: bool) -> None:
        rows, m, member_rows = candidates.rows, candidates.members, candidates.member_rows
        starts, ext_codes, ext_names, member_sizes = m.starts, m.ext_codes, m.ext_names, m.size
        n = rows.num_rows
        key_column = rows.column("key")
        self.key_array: pa.Array = member_bytes(key_column)
        self.key_data, self.key_offsets = binary_buffers(self.key_array)
        self.key_texts = key_column
        member_rows = np.asarray(member_rows, np.int64)
        counts = starts[member_rows + 1] - starts[member_rows]
        extras = _extra_columns(rows, with_label)
        present = [pc.is_valid(a).to_numpy(zero_copy_only=False) for _, a in extras]
        per = counts + sum((h.astype(np.int64) for h in present), np.zeros(n, np.int64))
        firsts = np.zeros(n + 1, np.int64)
        np.cumsum(per, out=firsts[1:])
        total = int(firsts[-1])
        owner = np.repeat(np.arange(n, dtype=np.int64), per)
        # source members: candidate i's k-th member is starts[member_rows[i]] + k
        within = np.arange(total, dtype=np.int64) - firsts[owner]
        own = within < counts[owner]
        source = np.where(own, starts[member_rows][owner] + within, -1)
        codes = np.empty(total, np.int64)
        sizes = np.empty(total, np.int64)
        codes[own] = ext_codes[source[own]]
        sizes[own] = member_sizes[source[own]]
        names = [*ext_names, *(field for field, _ in extras)]
        placed: list[tuple[Ints, Bytes, Ints]] = []  # (members, bytes, where they start)
        at = counts.copy()
        for k, ((_, values), has) in enumerate(zip(extras, present, strict=True)):
            which = np.flatnonzero(has)
            where = firsts[which] + at[which]
            codes[where] = len(ext_names) + k
            data, offsets = binary_buffers(values)
            sizes[where] = offsets[which + 1] - offsets[which]
            placed.append((where, data, offsets[which]))
            at += has
        self.n, self.total, self.firsts, self.owner = n, total, firsts, owner
        self.own, self.source, self.ext_codes, self.sizes = own, source, codes, sizes
        self.ext_names = names
        self._names(codes, owner)
        self._skeleton(placed)
        image = np.array([e.rpartition(".")[2].lower() in IMAGE_EXTENSIONS for e in names], bool)
        self.is_image = image[codes] & own if total else np.zeros(0, bool)
        self.own_members = np.flatnonzero(own)
        self.own_from = np.searchsorted(self.own_members, firsts)
        self._lists: tuple[list[int], ...] | None = None

    def _names(self, codes: Ints, owner: Ints) -> None:
        ext_raw = [e.encode() for e in self.ext_names]
        ext_len = np.array([len(e) for e in ext_raw], np.int64)
        ext_data = np.frombuffer(b"".join(ext_raw), np.uint8)
        ext_at = np.zeros(len(ext_raw) + 1, np.int64)
        np.cumsum(ext_len, out=ext_at[1:])
        key_len = np.diff(self.key_offsets)[owner]
        lengths = key_len + 1 + ext_len[codes]
        offsets = np.zeros(self.total + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.empty(int(offsets[-1]), np.uint8)
        data[spread(offsets[:-1], key_len)] = self.key_data[
            spread(self.key_offsets[:-1][owner], key_len)
        ]
        data[offsets[:-1] + key_len] = ord(".")
        data[spread(offsets[:-1] + key_len + 1, ext_len[codes])] = ext_data[
            spread(ext_at[:-1][codes], ext_len[codes])
        ]
        self.name_data, self.name_offsets, self.name_len = data, offsets, lengths

    def _skeleton(self, placed: list[tuple[Ints, Bytes, Ints]]) -> None:
        sizes, own = self.sizes, self.own
        heads = long_headers(self.name_data, self.name_offsets, sizes)
        hlen = np.full(self.total, BLOCK, np.int64)
        for t, head in heads.items():
            hlen[t] = len(head)
        pad = -sizes % BLOCK
        blocks = hlen // BLOCK + np.where(own, pad > 0, (sizes + BLOCK - 1) // BLOCK)
        bstart = np.zeros(self.total + 1, np.int64)
        np.cumsum(blocks, out=bstart[1:])
        skeleton = zeroed(int(bstart[-1]) * BLOCK)
        header_blocks(
            self.name_data, self.name_offsets, sizes, skeleton.reshape(-1, BLOCK), bstart[:-1]
        )
        for t, head in heads.items():
            begin = int(bstart[t]) * BLOCK
            skeleton[begin : begin + len(head)] = np.frombuffer(head, np.uint8)
        for where, data, start in placed:
            size = sizes[where]
            skeleton[spread(bstart[where] * BLOCK + hlen[where], size)] = data[spread(start, size)]
        self.view: memoryview = skeleton.data
        #: Skeleton positions of each member's block, header end and padding.
        self.block_start = bstart
        self.header_end = bstart[:-1] * BLOCK + hlen
        self.pad_start = bstart[1:] * BLOCK - pad
        length = hlen + sizes + pad
        before = np.zeros(self.total + 1, np.int64)
        np.cumsum(length, out=before[1:])
        firsts = self.firsts
        self.data_at = before[:-1] - before[firsts[:-1]][self.owner] + hlen
        self.sample_bytes = before[firsts[1:]] - before[firsts[:-1]]

    def pieces(self, i: int) -> list[memoryview | int]:
        """Candidate ``i``'s tar bytes: skeleton runs between its source members' numbers
        (``~j`` for an image)."""
        if self._lists is None:  # Python lists once, for the per-sample loop
            self._lists = (
                self.firsts.tolist(),
                (self.block_start * BLOCK).tolist(),
                self.own_members.tolist(),
                self.own_from.tolist(),
                self.header_end.tolist(),
                self.pad_start.tolist(),
                np.where(self.is_image, ~self.source, self.source).tolist(),
            )
        firsts, block_at, owns, own_from, header_end, pad_start, number = self._lists
        a, b = firsts[i], firsts[i + 1]
        if a == b:
            return []
        view = self.view
        out: list[memoryview | int] = []
        at = block_at[a]
        for t in owns[own_from[i] : own_from[i + 1]]:
            out.append(view[at : header_end[t]])
            out.append(number[t])
            at = pad_start[t]
        out.append(view[at : block_at[b]])
        return out

    def key(self, i: int) -> str:
        return str(self.key_texts[i].as_py())

    def names_of(self, members: Ints) -> pa.Array:
        """The members' names (-1: empty) as a string array."""
        which = np.maximum(members, 0)
        lengths = np.where(members >= 0, self.name_len[which], 0)
        offsets = np.zeros(len(members) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = self.name_data[spread(self.name_offsets[which], lengths)]
        return string_array(data, offsets).cast(pa.string())


def tar_sizes(
    rows: pa.Table, members: Members, member_rows: npt.NDArray[np.int64], *, with_label: bool
) -> npt.NDArray[np.int64]:
    """Exact tar bytes of each sample before it is written, all samples at once."""
    n = rows.num_rows
    keys = rows.column("key")
    key_len = pc.binary_length(keys).to_numpy(zero_copy_only=False).astype(np.int64)
    counts = members.starts[member_rows + 1] - members.starts[member_rows]
    flat = spread(members.starts[member_rows], counts)
    ext_len = np.array([len(e.encode()) for e in members.ext_names], np.int64)
    lens = ext_len[members.ext_codes[flat]]
    owner = np.repeat(np.arange(n), counts)
    name_len = key_len[owner] + 1 + lens
    sizes = members.size[flat]
    total = np.bincount(owner, weights=sizes + (-sizes % BLOCK), minlength=n).astype(np.int64)
    total += np.bincount(
        owner, weights=_header_bytes(name_len, keys, owner, flat, members), minlength=n
    ).astype(np.int64)
    if with_label:
        labels = rows.column("label")
        has = pc.is_valid(labels).to_numpy(zero_copy_only=False)
        total += np.where(has, _header_bytes(key_len + 4, keys) + BLOCK, 0)
    if JSON_COLUMN in rows.column_names:
        texts = rows.column(JSON_COLUMN)
        has = pc.is_valid(texts).to_numpy(zero_copy_only=False)
        length = pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False)
        length = length.astype(np.int64)
        total += np.where(has, _header_bytes(key_len + 5, keys) + length + (-length % BLOCK), 0)
    return total


def _header_bytes(
    name_len: npt.NDArray[np.int64],
    keys: pa.ChunkedArray | pa.Array,
    owner: npt.NDArray[np.int64] | None = None,
    flat: npt.NDArray[np.int64] | None = None,
    members: Members | None = None,
) -> npt.NDArray[np.int64]:
    """Header bytes of each member: one block, more for names past ustar's 100 bytes."""
    out = np.full(len(name_len), BLOCK, np.int64)
    for t in np.flatnonzero(name_len > 100).tolist():
        i = t if owner is None else int(owner[t])
        key = keys[i].as_py()
        if members is not None and flat is not None:
            ext = members.ext(int(flat[t]))
        else:
            ext = LABEL_FIELD if name_len[t] == len(key.encode()) + 4 else "json"
        out[t] = member_header(f"{key}.{ext}")[1]
    return out
