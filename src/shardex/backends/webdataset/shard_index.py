"""A written shard's member indexes, all samples at once: DALI's index file and the
member spans of ``index-members.npy``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.backends.webdataset.layout import (
    Ints,
    ShardLayout,
    binary_buffers,
    gathered,
    int_array,
    spread,
    string_array,
)
from shardex.format.dali_index import VERSION, VERSION_WITHOUT_NAMES, Component
from shardex.format.dali_index import WHITESPACE as DALI_WHITESPACE
from shardex.format.index import ABSENT, MAX_MEMBER_COLUMNS, MemberSpans, member_row

#: C++ ``isspace()`` (see shardex.format.dali_index).
_WHITESPACE = np.frombuffer(b" \t\n\v\f\r", np.uint8)


def member_indexes(
    layout: ShardLayout, taken: Ints, offsets: list[int], *, dali: bool
) -> tuple[bytes | None, MemberSpans | None]:
    """The DALI index file and member spans of the ``taken`` candidates (None: cannot)."""
    firsts = layout.firsts
    counts = firsts[taken + 1] - firsts[taken]
    flat = spread(firsts[taken], counts)  # their members, sample after sample
    index = _dali_index(layout, offsets, counts, flat) if dali else None
    return index, _member_spans(layout, taken, counts, flat)


def _components(layout: ShardLayout, taken: Ints) -> list[list[Component]]:
    """Each taken sample's members: extension, data offset, size and name."""
    firsts, sizes, at = layout.firsts.tolist(), layout.sizes.tolist(), layout.data_at.tolist()
    codes = layout.ext_codes.tolist()
    data, offsets = layout.name_data, layout.name_offsets.tolist()
    return [
        [
            (
                layout.ext_names[codes[t]],
                at[t],
                sizes[t],
                data[offsets[t] : offsets[t + 1]].tobytes().decode(),
            )
            for t in range(firsts[i], firsts[i + 1])
        ]
        for i in taken.tolist()
    ]


def _dali_index(layout: ShardLayout, offsets: list[int], counts: Ints, flat: Ints) -> bytes | None:
    """:meth:`~shardex.format.dali_index.DaliIndex.to_bytes` built by Arrow (None: cannot)."""
    if not len(counts) or int(counts.min()) == 0:
        return None
    exts = [layout.ext_names[c] for c in np.unique(layout.ext_codes[flat]).tolist()]
    if any(not e or DALI_WHITESPACE.search(e) for e in exts):
        return None
    ext_raw = [e.encode() for e in layout.ext_names]
    ext_at = np.zeros(len(ext_raw) + 1, np.int64)
    np.cumsum([len(e) for e in ext_raw], out=ext_at[1:])
    ext_data, ext_offsets = gathered(
        np.frombuffer(b"".join(ext_raw), np.uint8), ext_at, layout.ext_codes[flat]
    )
    starts = np.repeat(np.array(offsets, np.int64), counts)
    ends = np.full(len(flat), ord(" "), np.uint8)
    ends[np.cumsum(counts) - 1] = ord("\n")
    m = len(flat)
    one = np.arange(m + 1, dtype=np.int64)  # offsets of one-byte strings
    space = string_array(np.full(m, ord(" "), np.uint8), one)
    fields = [
        string_array(ext_data, ext_offsets),
        space,
        pc.cast(int_array(starts + layout.data_at[flat], pa.int64()), pa.large_string()),
        space,
        pc.cast(int_array(layout.sizes[flat], pa.int64()), pa.large_string()),
    ]
    names_data, _ = gathered(layout.name_data, layout.name_offsets, flat)
    if np.isin(names_data, _WHITESPACE).any():
        version = VERSION_WITHOUT_NAMES
    else:
        version = VERSION
        names = layout.names_of(flat).cast(pa.large_string())
        fields += [space, names]
    fields.append(string_array(ends, one))
    nothing = string_array(np.zeros(0, np.uint8), np.zeros(m + 1, np.int64))
    lines = pc.binary_join_element_wise(*fields, nothing)  # no separator: the fields hold it
    data, at = binary_buffers(lines)
    return f"{version} {len(counts)}\n".encode() + data[at[0] : at[-1]].tobytes()


def _member_spans(layout: ShardLayout, taken: Ints, counts: Ints, flat: Ints) -> MemberSpans | None:
    """The taken samples' index-members rows; None past MAX_MEMBER_COLUMNS extensions."""
    if _plain_names(layout, taken, flat):
        return _plain_spans(layout, taken, counts, flat)
    return MemberSpans.of(
        [
            member_row([(name, at, size) for _, at, size, name in parts])
            for parts in _components(layout, taken)
        ]
    )


def _plain_names(layout: ShardLayout, taken: Ints, flat: Ints) -> bool:
    """Whether every member's name splits as ``KEY.EXT`` the way
    :func:`~shardex.format.index.member_row` would (so numpy can build the rows)."""
    if len(flat) and int(layout.name_len[flat].max()) > 100:
        return False
    codes = np.unique(layout.ext_codes[flat]).tolist()
    if any(not layout.ext_names[c] or "/" in layout.ext_names[c] for c in codes):
        return False
    data, offsets = gathered(layout.key_data, layout.key_offsets, taken)
    keys = string_array(data, offsets)
    return not pc.any(pc.match_substring_regex(keys, r"\.[^/]*$")).as_py()


def _plain_spans(layout: ShardLayout, taken: Ints, counts: Ints, flat: Ints) -> MemberSpans | None:
    """:meth:`MemberSpans.of` for samples of :func:`_plain_names`, with numpy."""
    n = len(taken)
    # a column per extension, in order of first appearance
    ext_ids = {e: k for k, e in enumerate(dict.fromkeys(layout.ext_names))}
    ids = np.array([ext_ids[e] for e in layout.ext_names], np.int64)[layout.ext_codes[flat]]
    seen, first = np.unique(ids, return_index=True)
    order = seen[np.argsort(first)]
    if len(order) > MAX_MEMBER_COLUMNS:
        return None
    column = np.zeros(len(ext_ids), np.int64)
    column[order] = np.arange(len(order))
    col = column[ids]
    sample = np.repeat(np.arange(n, dtype=np.int64), counts)
    spans = np.full((n, 2 + 2 * len(order)), ABSENT, np.uint32)
    spans[:, 0] = 0
    key_len = np.diff(layout.key_offsets)[taken]
    spans[:, 1] = np.where(counts > 0, key_len, ABSENT)
    spans[sample, 2 + 2 * col] = layout.data_at[flat]
    spans[sample, 3 + 2 * col] = layout.sizes[flat]
    cells = sample * max(len(order), 1) + col
    if len(np.unique(cells)) != len(cells):  # a repeated extension: readers parse those
        dup = np.ones(len(cells), bool)
        dup[np.unique(cells, return_index=True)[1]] = False
        spans[sample[dup], 1] = ABSENT
        # the last of equal extensions holds the cell, as in MemberSpans.of
        last = np.unique(cells[::-1], return_index=True)[1]
        keep = len(cells) - 1 - last
        spans[sample[keep], 2 + 2 * col[keep]] = layout.data_at[flat][keep]
        spans[sample[keep], 3 + 2 * col[keep]] = layout.sizes[flat][keep]
    names = list(ext_ids)
    return MemberSpans(tuple(names[e] for e in order.tolist()), spans)
