"""The vectorised shard writer's parts (``writer._fill_inline``): member views, images
checked with numpy, and each sample's pieces and checksum, all samples at once."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import eq
from typing import Final

import numpy as np
import numpy.typing as npt
import xxhash

from shardex.backends.webdataset.layout import Bytes, Ints, ShardLayout, binary_buffers
from shardex.format.tar import BLOCK
from shardex.refs.members import Members
from shardex.refs.pinned import pinned_views as pinned
from shardex.sample_check import SampleCheck, image_problem
from shardex.storage.fetch.bytes import ByteSource


@dataclass(frozen=True, slots=True)
class Heads:
    """Members whose heads only are in a spot's buffer: whether each ends as a JPEG does,
    and whether its head is cut short (``HEAD_BYTES``)."""

    ends: npt.NDArray[np.bool_]
    cut: npt.NDArray[np.bool_]

    def pick(self, mask: npt.NDArray[np.bool_]) -> Heads:
        return Heads(self.ends[mask], self.cut[mask])


#: A buffer's bytes, and its members' numbers and byte ranges (or heads).
Spot = tuple[Bytes, Ints, Ints, Ints, Heads | None]
Views = tuple[list[memoryview], list[Spot]]

FILES_BYTES: Final = 64 << 20
#: Bytes of each pinned member gathered for the JPEG test: the frame header is near the
#: start (an image whose header lies further is checked on its own, in place).
HEAD_BYTES: Final = 1024
_JPEG_END: Final = b"\xff\xd9"


def file_views(source: ByteSource, js: Ints, sizes: Ints) -> Views | None:
    """:func:`member_views` for local files read into one buffer (None: not possible)."""
    read = source.read_files(js, FILES_BYTES)
    if read is None:
        return None
    data, lo, views = read
    return views, [(data, np.arange(len(js)), lo, lo + sizes, None)]


def pinned_views(members: Members, js: Ints, sizes: Ints) -> Views | None:
    """Views of pinned members in the caller's buffers (no copy), and their heads gathered
    for the JPEG test; None on a size mismatch."""
    codes = members.path_codes[js]
    lists = np.unique(codes).tolist()
    if len(lists) == 1:  # one field's list: the common case
        views = pinned(members.path_names[lists[0]], members.offset[js].tolist())
    else:
        views = [memoryview(b"")] * len(js)
        for code in lists:
            at = np.flatnonzero(codes == code)
            got = pinned(members.path_names[code], members.offset[js[at]].tolist())
            for t, v in zip(at.tolist(), got, strict=True):
                views[t] = v
    if not np.array_equal(np.fromiter(map(len, views), np.int64, len(views)), sizes):
        return None
    cut: Callable[[memoryview, slice], memoryview] = memoryview.__getitem__
    data = np.frombuffer(b"".join(map(cut, views, repeat(slice(HEAD_BYTES)))), np.uint8)
    head = np.minimum(sizes, HEAD_BYTES)
    hi = np.cumsum(head)
    tails = map(cut, views, repeat(slice(-2, None)))
    heads = Heads(
        np.fromiter(map(eq, tails, repeat(_JPEG_END)), np.bool_, len(views)), sizes > head
    )
    return views, [(data, np.arange(len(js)), hi - head, hi, heads)]


def member_views(members: Members, js: Ints, sizes: Ints) -> Views | None:
    """Views of inline members' bytes in their Arrow chunks; None on a size mismatch."""
    chunks = members.data.chunks
    bounds = np.zeros(len(chunks) + 1, np.int64)
    np.cumsum([len(c) for c in chunks], out=bounds[1:])
    which = np.searchsorted(bounds, js, side="right") - 1
    views: list[memoryview] = [memoryview(b"")] * len(js)
    spots: list[Spot] = []
    for c in np.unique(which).tolist():
        chunk = chunks[c]
        data, offsets = binary_buffers(chunk)
        at = np.flatnonzero(which == c)
        local = js[at] - bounds[c]
        lo, hi = offsets[local], offsets[local + 1]
        if not np.array_equal(hi - lo, sizes[at]):
            return None
        # unsigned (Arrow's buffers are signed chars): views compare as bytes
        mv: memoryview = data.data
        got = list(map(mv.__getitem__, map(slice, lo.tolist(), hi.tolist())))
        if len(at) == len(js):
            views = got
        else:
            for t, v in zip(at.tolist(), got, strict=True):
                views[t] = v
        spots.append((data, at, lo, hi, None))
    return views, spots


def resident_views(source: ByteSource, js: Ints, sizes: Ints) -> Views | None:
    """Views of members inline or pinned, in any mix (None: a size mismatch)."""
    inline = source.members.inline[js]
    if inline.all():
        return member_views(source.members, js, sizes)
    views: list[memoryview] = [memoryview(b"")] * len(js)
    spots: list[Spot] = []
    for at in (np.flatnonzero(inline), np.flatnonzero(~inline)):
        if not len(at):
            continue
        view = member_views if inline[at[0]] else pinned_views
        got = view(source.members, js[at], sizes[at])
        if got is None:
            return None
        for t, v in zip(at.tolist(), got[0], strict=True):
            views[t] = v
        spots += [(data, at[a], lo, hi, heads) for data, a, lo, hi, heads in got[1]]
    return views, spots


def images_good(
    views: list[memoryview], spots: list[Spot], images: Ints, check: SampleCheck
) -> bool:
    """Whether every image passes ``check``: JPEGs all at once with numpy, the rest
    one by one."""
    mask = np.zeros(len(views), bool)
    mask[images] = True
    for data, at, lo, hi, heads in spots:
        pick = mask[at]
        lo_i, hi_i = lo[pick], hi[pick]
        if check.validate == "none":
            if (hi_i == lo_i).any():
                return False
            continue
        ok = jpegs_good(
            data, lo_i, hi_i, check.max_pixels, None if heads is None else heads.pick(pick)
        )
        for t in at[pick][~ok].tolist():
            if image_problem(views[t], check) is not None:
                return False
    return True


#: JPEG start-of-frame markers, as :func:`~shardex.codecs.images.jpeg_size` knows.
_FRAMES: Final = np.array(
    [0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF], np.uint8
)


def jpegs_good(
    data: Bytes, lo: Ints, hi: Ints, limit: int, heads: Heads | None = None
) -> npt.NDArray[np.bool_]:
    """Per image ``data[lo:hi]``: whether :func:`~shardex.sample_check.image_problem`'s
    fast JPEG test passes (False: check it one by one). ``heads``: ``data`` holds the
    images' heads only (one cut before its frame header is checked one by one)."""
    size = hi - lo
    ok = size > 4
    if len(data) < 5:  # the stand-in indices of too-short images must exist
        data = np.pad(data, (0, 5 - len(data)))
    safe_lo = np.where(ok, lo, 0)
    safe_hi = np.where(ok, hi, 5)
    ok &= (data[safe_lo] == 0xFF) & (data[safe_lo + 1] == 0xD8) & (data[safe_lo + 2] == 0xFF)
    if heads is None:
        ok &= (data[safe_hi - 2] == 0xFF) & (data[safe_hi - 1] == 0xD9)
    else:
        ok &= heads.ends
    # the marker walk, for every image still open at once
    live = np.flatnonzero(ok)
    pos = np.full(len(live), 2, np.int64)
    for _ in range(512):
        if not len(live):
            break
        room = pos + 9 <= size[live]
        if heads is not None:  # past a cut head: unknown, not a JPEG without a frame header
            ok[live[~room & heads.cut[live]]] = False
        live, pos = live[room], pos[room]  # no frame header before the end: size unknown
        at = lo[live] + pos
        marker = data[at] == 0xFF
        live, pos, at = live[marker], pos[marker], at[marker]  # not a marker: unknown
        frame = np.isin(data[at + 1], _FRAMES)
        found, f_at = live[frame], at[frame]
        height = data[f_at + 5].astype(np.int64) << 8 | data[f_at + 6]
        width = data[f_at + 7].astype(np.int64) << 8 | data[f_at + 8]
        ok[found] = width * height <= limit
        rest = ~frame
        live, pos, at = live[rest], pos[rest], at[rest]
        pos = pos + 2 + (data[at + 2].astype(np.int64) << 8 | data[at + 3])
    return ok


def sample_pieces(layout: ShardLayout, k: int, views: list[memoryview]) -> list[list[memoryview]]:
    """The first ``k`` candidates' tar bytes as columns of pieces, one per candidate:
    skeleton run, source member, run, ... (empty where a candidate has fewer)."""
    view = layout.view
    first, own_from, ts = layout.firsts, layout.own_from, layout.own_members
    counts = own_from[1 : k + 1] - own_from[:k]
    finish = layout.block_start[first[1 : k + 1]] * BLOCK
    most = int(counts.max())
    empty = memoryview(b"")

    def run(a: Ints, b: Ints) -> list[memoryview]:
        return list(map(view.__getitem__, map(slice, a.tolist(), b.tolist())))

    def member(q: int) -> Ints:  # each sample's q-th source member
        return ts[np.minimum(own_from[:k] + q, max(len(ts) - 1, 0))] if len(ts) else own_from[:k]

    begin = layout.block_start[first[:k]] * BLOCK
    columns = [run(begin, np.where(counts > 0, layout.header_end[member(0)], finish))]
    uniform = bool((counts == most).all())
    for q in range(most):
        has = counts > q
        if uniform:
            columns.append(views[q::most])
        else:
            at = own_from[:k] - own_from[0] + q
            columns.append(
                [views[a] if h else empty for a, h in zip(at.tolist(), has.tolist(), strict=True)]
            )
        start = np.where(has, layout.pad_start[member(q)], finish)
        stop = np.where(counts > q + 1, layout.header_end[member(q + 1)], finish)
        columns.append(run(start, stop))
    return columns


def sample_sums(columns: list[list[memoryview]], first_sample: int | None) -> list[int]:
    """Each sample's checksum over its pieces, seeded as ``writer._fill`` seeds it."""
    k = len(columns[0])
    seeds = [0] * k if first_sample is None else range(first_sample, first_sample + k)
    hashers = list(map(xxhash.xxh3_64, columns[0], seeds))
    update = xxhash.xxh3_64.update
    for column in columns[1:]:
        collections.deque(map(update, hashers, column), 0)
    return list(map(xxhash.xxh3_64.intdigest, hashers))
