"""Writing one tar shard and its Parquet sidecar.

A sample's members are written back to back: the source members in order (the image
first), then ``KEY.cls`` (the label as ASCII digits) and ``KEY.json`` (scalar metadata).
The sample's byte range runs from its first header to the end of its last member's
padding; its checksum covers exactly that range. Beside the tar goes DALI's index file of
the members (see :mod:`shardex.format.dali_index`), computed from the same layout.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from shardex.backends.webdataset.layout import (
    Ints,
    ShardLayout,
    binary_buffers,
    gathered,
    int_array,
    spread,
    string_array,
)
from shardex.errors import BadSampleError, ShardexError
from shardex.format.dali_index import VERSION, VERSION_WITHOUT_NAMES, Component
from shardex.format.dali_index import WHITESPACE as DALI_WHITESPACE
from shardex.format.index import ABSENT, MAX_MEMBER_COLUMNS, MemberSpans, member_row
from shardex.format.tables import arrow_reader, parquet_file, shard_checksum
from shardex.format.tar import BLOCK, END_OF_ARCHIVE, member_header
from shardex.planning import plan_bounds
from shardex.refs.candidates import Candidates
from shardex.refs.members import JSON_COLUMN, LABEL_FIELD, Members, json_text_column
from shardex.refs.scan import MEMBERS
from shardex.sample_check import SampleCheck, image_problem, refusal
from shardex.storage.base import Storage
from shardex.storage.fetch.bytes import ByteSource


def tar_sizes(
    rows: pa.Table,
    members: Members,
    member_rows: npt.NDArray[np.int64],
    *,
    with_label: bool,
) -> npt.NDArray[np.int64]:
    """Exact tar bytes of each sample (headers, data, padding) before it is written:
    computed over all samples at once from member sizes and name lengths."""
    n = rows.num_rows
    keys = rows.column("key")
    key_len = pc.binary_length(keys).to_numpy(zero_copy_only=False).astype(np.int64)
    counts = members.starts[member_rows + 1] - members.starts[member_rows]
    flat = (
        np.arange(int(counts.sum()), dtype=np.int64)
        - np.repeat(np.cumsum(counts) - counts, counts)
        + np.repeat(members.starts[member_rows], counts)
    )
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
    """Header bytes before each member's data: one block, more for the rare names past
    ustar's 100 bytes (computed one by one)."""
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


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to write from its candidate samples, and where to put it.

    ``candidates`` are the samples it may hold (their ``sizes``: planned tar bytes). The
    shard takes good candidates in order until it holds ``samples_per_shard`` samples or
    the next would pass ``max_shard_bytes``; bad ones are skipped (or refuse the export).

    With ``resume``, a shard whose tar and sidecar already exist is kept when the sidecar's
    keys, byte ranges and checksums equal those of the samples it should hold (the source
    is read and hashed, nothing is uploaded); otherwise it is written again.
    """

    storage: Storage
    tar_path: str
    parquet_path: str
    candidates: Candidates
    with_label: bool
    samples_per_shard: int
    max_shard_bytes: int | None = None
    #: The sample number (in the split) of the shard's first sample.
    first_sample: int = 0
    check: SampleCheck = dataclasses.field(default_factory=SampleCheck)
    resume: bool = False
    dali_index_path: str | None = None
    #: Set when the committed export names this shard's paths: the shard is kept if it
    #: holds exactly these samples, else written under these (tar, parquet, idx) paths
    #: instead, never over a file the committed config.yaml names.
    alternate: tuple[str, str, str] | None = None
    #: Seed each sample's checksum with its sample number, as format version 2 does;
    #: False writes format version 1's unseeded checksums.
    seeded: bool = True


@dataclass(frozen=True, slots=True)
class ShardWritten:
    """What writing (or keeping) one shard produced."""

    num_bytes: int
    checksum: str
    offsets: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint64]
    table: pa.Table
    dali_index: str | None = None
    tar_path: str = ""
    parquet_path: str = ""
    #: The sidecar's whole-file checksum, as config.yaml records it.
    metadata_checksum: str | None = None
    #: Candidates taken (written or skipped) from the job's first one.
    consumed: int = 0
    #: False when the shard ran out of candidates before it was full (not the split's end).
    complete: bool = True
    #: errors.parquet rows of the candidates skipped as bad.
    skipped: tuple[dict[str, str], ...] = ()
    #: The key hashes of the written samples (the split's key table).
    key_hashes: npt.NDArray[np.uint64] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.uint64)
    )
    #: Where each sample's members lie (the split's ``index-members.npy`` rows).
    members: MemberSpans | None = None

    @property
    def num_samples(self) -> int:
        return len(self.offsets)


def _layout(job: ShardJob) -> ShardLayout:
    candidates = job.candidates
    members = candidates.members
    return ShardLayout(
        candidates.rows,
        members.starts,
        members.ext_codes,
        members.ext_names,
        members.size,
        candidates.member_rows,
        job.with_label,
    )


class _TarOut:
    """The shard's bytes on their way out: the parts (headers, the members' own buffers,
    padding) gathered into large writes without being copied into one buffer (a local
    file takes them with one ``writev``), hashed whole; the object is opened with the
    first write (a shard of no good sample is no object). ``writing=False`` only hashes
    (a shard left by an interrupted export is checked)."""

    def __init__(self, job: ShardJob, stack: contextlib.ExitStack, writing: bool) -> None:
        self._job, self._stack, self.writing = job, stack, writing
        self._out: Any = None
        self.whole = xxhash.xxh3_64()
        #: The parts not written yet, and their bytes.
        self.parts: list[bytes | bytearray | memoryview] = []
        self.pending = 0

    def flush(self) -> None:
        collections.deque(map(self.whole.update, self.parts), 0)  # no Python frame a part
        if self.writing:
            if self._out is None:
                self._out = self._stack.enter_context(
                    self._job.storage.open_writer(self._job.tar_path)
                )
            self._out.write_parts(self.parts)
        self.parts = []
        self.pending = 0


@dataclass(slots=True)
class _Picked:
    """The samples a shard took: candidate numbers, byte ranges and checksums."""

    taken: list[int] = dataclasses.field(default_factory=list)
    offsets: list[int] = dataclasses.field(default_factory=list)
    lengths: list[int] = dataclasses.field(default_factory=list)
    sums: list[int] = dataclasses.field(default_factory=list)
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)
    consumed: int = 0
    full: bool = False
    size: int = 0


class _Mismatch(Exception):
    """A shard left by an interrupted export differs from what this one writes."""


def _fill(
    job: ShardJob, layout: ShardLayout, source: ByteSource, out: _TarOut, old: _Existing | None
) -> _Picked:
    """Take good candidates in order until the shard is full; append each to ``out``.
    Each member's bytes are read once: checked (images), appended and hashed. This loop
    runs once per sample: it holds only what must be done per sample."""
    got = _Picked()
    sizes = job.candidates.sizes.tolist()
    pieces_of, lengths_of = layout.pieces, layout.sample_bytes.tolist()
    cap, limit, check = job.max_shard_bytes, job.samples_per_shard, job.check
    taken, offsets, lengths, sums = got.taken, got.offsets, got.lengths, got.sums
    read, hasher = source.read, xxhash.xxh3_64
    used, pos, seed = len(END_OF_ARCHIVE), 0, job.first_sample if job.seeded else None
    parts = out.parts
    for i in range(job.candidates.rows.num_rows):
        count = len(taken)
        if count >= limit or (cap is not None and count and used + sizes[i] > cap):
            got.full = True
            break
        got.consumed = i + 1
        reason = None
        start = len(parts)
        for p in pieces_of(i):
            if type(p) is int:  # a source member: read (its own buffer), checked if an image
                try:
                    data = read(p if p >= 0 else ~p)
                except BadSampleError as exc:
                    reason = exc.reason or str(exc)
                    break
                if p < 0:
                    reason = image_problem(data, check)
                    if reason:
                        break
                parts.append(data)
            else:
                parts.append(p)  # type: ignore[arg-type]  # bytes: not an int
        if reason:
            del parts[start:]
            _bad(job, layout, i, reason, got)
            continue
        # the sample's checksum over its parts as they lie back to back in the tar
        h = hasher(seed=0 if seed is None else seed + count)
        for k in range(start, len(parts)):
            h.update(parts[k])
        digest = h.intdigest()
        length = lengths_of[i]
        taken.append(i)
        offsets.append(pos)
        lengths.append(length)
        sums.append(digest)
        pos += length
        used += sizes[i]
        out.pending += length
        if old is not None and not _same_prefix(old, count, pos, digest):
            raise _Mismatch
        if out.pending >= _FLUSH or len(parts) >= _FLUSH_PARTS:
            out.flush()
            parts = out.parts
    got.size = pos + len(END_OF_ARCHIVE)
    return got


def _bad(job: ShardJob, layout: ShardLayout, i: int, reason: str, got: _Picked) -> None:
    """A bad candidate: refuse the export, or record it and go on."""
    original = str(job.candidates.rows.column("original_path")[i].as_py())
    if job.check.on_error == "error":
        raise BadSampleError(refusal(original, reason), reason=reason)
    got.skipped.append({"key": layout.key(i), "original_path": original, "reason": reason})


def _planned_take(job: ShardJob) -> int:
    """How many candidates the shard takes when every one is good (as :func:`_fill`
    decides: up to ``samples_per_shard``, and within ``max_shard_bytes``)."""
    n = job.candidates.rows.num_rows
    take = int(min(n, job.samples_per_shard))
    cap = job.max_shard_bytes
    if cap is not None and take > 1:
        used = len(END_OF_ARCHIVE) + np.cumsum(np.asarray(job.candidates.sizes[:take], np.int64))
        over = np.flatnonzero(used[1:] > cap)
        if len(over):
            take = int(over[0]) + 1
    return take


def _fill_inline(
    job: ShardJob, layout: ShardLayout, out: _TarOut, source: ByteSource | None = None
) -> _Picked | None:
    """:func:`_fill` for a shard whose source members are all in this process's memory
    (Arrow buffers) or all whole local files (with ``source``: an image folder's, read
    back to back into one buffer of at most :data:`_FILES_BYTES`), done over all its
    samples at once: the images' headers checked with numpy, the pieces taken as views
    and each sample hashed without a Python frame per sample. None (nothing written)
    when a taken candidate is bad, or cannot be taken this way: :func:`_fill` then
    writes the shard, one sample at a time (the files read here are not read again)."""
    check = job.check
    if check.validate == "decode" or not job.candidates.rows.num_rows:
        return None
    k = _planned_take(job)
    ts = layout.own_members[: layout.own_from[k]]
    js = layout.source[ts]
    members = job.candidates.members
    if members.inline[js].all():
        got = _member_views(members, js, layout.sizes[ts])
    elif source is not None:
        got = _file_views(source, js, layout.sizes[ts])
    else:
        return None
    if got is None:
        return None
    views, spots = got
    images = np.flatnonzero(layout.is_image[ts])
    if len(images) and not _images_good(views, spots, images, check):
        return None
    # the tar: each sample's pieces (skeleton runs between its source members, which
    # are views of their buffers), hashed and written as they are
    columns = _sample_pieces(layout, k, views)
    sums = _sample_sums(job, k, columns)
    pieces: list[memoryview] = [layout.view] * (k * len(columns))
    for c, column in enumerate(columns):
        pieces[c :: len(columns)] = column
    lengths = layout.sample_bytes[:k]
    offsets = np.zeros(k, np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    size = int(offsets[-1] + lengths[-1])
    _put(out, pieces, np.fromiter(map(len, pieces), np.int64, len(pieces)))
    return _Picked(
        taken=list(range(k)),
        offsets=offsets.tolist(),
        lengths=lengths.tolist(),
        sums=sums,
        consumed=k,
        full=k < job.candidates.rows.num_rows,
        size=size + len(END_OF_ARCHIVE),
    )


#: The most bytes of local files a shard reads into one buffer to be written at once.
_FILES_BYTES: Final = 64 << 20


def _file_views(
    source: ByteSource, js: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> tuple[list[memoryview], list[tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]]] | None:
    """:func:`_member_views` for members in local files: read into one buffer (None when
    they cannot all be read as listed, or hold more than :data:`_FILES_BYTES`)."""
    read = source.read_files(js, _FILES_BYTES)
    if read is None:
        return None
    data, lo, views = read
    return views, [(data, np.arange(len(js)), lo, lo + sizes)]  # type: ignore[list-item]


def _member_views(
    members: Members, js: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> tuple[list[memoryview], list[tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]]] | None:
    """Views of inline members' bytes in their Arrow chunks, and per member its chunk's
    bytes (numpy) and start; None when a member's bytes are not its recorded size."""
    chunks = members.data.chunks
    bounds = np.zeros(len(chunks) + 1, np.int64)
    np.cumsum([len(c) for c in chunks], out=bounds[1:])
    which = np.searchsorted(bounds, js, side="right") - 1
    views: list[memoryview] = [memoryview(b"")] * len(js)
    spots = []
    for c in np.unique(which).tolist():
        chunk = chunks[c]
        data, offsets = binary_buffers(chunk)
        at = np.flatnonzero(which == c)
        local = js[at] - bounds[c]
        lo, hi = offsets[local], offsets[local + 1]
        if not np.array_equal(hi - lo, sizes[at]):
            return None
        # Arrow's buffers are signed chars to memoryview: unsigned, they compare as bytes
        mv: memoryview = data.data
        got = list(map(mv.__getitem__, map(slice, lo.tolist(), hi.tolist())))
        if len(at) == len(js):
            views = got
        else:
            for t, v in zip(at.tolist(), got, strict=True):
                views[t] = v
        spots.append((data, at, lo, hi))
    return views, spots  # type: ignore[return-value]


def _images_good(
    views: list[memoryview],
    spots: list[Any],
    images: npt.NDArray[np.int64],
    check: SampleCheck,
) -> bool:
    """Whether every image among the members passes ``check`` (``header`` or ``none``):
    JPEGs that end with their end-of-image marker are checked with numpy, all at once
    (the marker walk of :func:`~shardex.codecs.images.jpeg_size`); the rest one by one."""
    mask = np.zeros(len(views), bool)
    mask[images] = True
    for data, at, lo, hi in spots:
        pick = mask[at]
        lo_i, hi_i = lo[pick], hi[pick]
        if check.validate == "none":
            if (hi_i == lo_i).any():
                return False
            continue
        ok = _jpegs_good(data, lo_i, hi_i, check.max_pixels)
        for t in at[pick][~ok].tolist():
            if image_problem(views[t], check) is not None:
                return False
    return True


#: JPEG frame markers (start of frame), as :func:`~shardex.codecs.images.jpeg_size` knows.
_FRAMES: Final = np.array(
    [0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF], np.uint8
)


def _jpegs_good(
    data: npt.NDArray[np.uint8], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], limit: int
) -> npt.NDArray[np.bool_]:
    """Per image ``data[lo:hi]``: True where :func:`~shardex.sample_check.image_problem`'s
    fast JPEG test passes (JPEG start, end-of-image marker, pixel size within ``limit``
    or not found); False: to check one by one."""
    size = hi - lo
    ok = size > 4
    if len(data) < 5:  # the images too short to test: their stand-in indices must exist
        data = np.pad(data, (0, 5 - len(data)))
    safe_lo = np.where(ok, lo, 0)
    safe_hi = np.where(ok, hi, 5)
    ok &= (data[safe_lo] == 0xFF) & (data[safe_lo + 1] == 0xD8) & (data[safe_lo + 2] == 0xFF)
    ok &= (data[safe_hi - 2] == 0xFF) & (data[safe_hi - 1] == 0xD9)
    # the marker walk, for every image still open at once
    live = np.flatnonzero(ok)
    pos = np.full(len(live), 2, np.int64)
    for _ in range(512):
        if not len(live):
            break
        room = pos + 9 <= size[live]
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


def _sample_pieces(layout: ShardLayout, k: int, views: list[memoryview]) -> list[list[memoryview]]:
    """The first ``k`` candidates' tar bytes as columns of pieces, one piece per
    candidate in each: its first skeleton run, its first source member, the run after
    it, ... (empty pieces where a candidate has fewer source members than another)."""
    view = layout.view
    first, own_from, ts = layout.firsts, layout.own_from, layout.own_members
    counts = own_from[1 : k + 1] - own_from[:k]
    finish = layout.block_start[first[1 : k + 1]] * BLOCK
    most = int(counts.max())
    empty = memoryview(b"")

    def run(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> list[memoryview]:
        return list(map(view.__getitem__, map(slice, a.tolist(), b.tolist())))

    def member(q: int) -> npt.NDArray[np.int64]:  # each sample's q-th source member
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


def _sample_sums(job: ShardJob, k: int, columns: list[list[memoryview]]) -> list[int]:
    """Each of the first ``k`` candidates' checksum over its pieces (seeded with its
    sample number as :func:`_fill` seeds it): one ``map`` a column, no Python frame a
    sample."""
    seed = job.first_sample if job.seeded else 0
    seeds = range(seed, seed + k) if job.seeded else [0] * k
    hashers = list(map(xxhash.xxh3_64, columns[0], seeds))
    update = xxhash.xxh3_64.update
    for column in columns[1:]:
        collections.deque(map(update, hashers, column), 0)
    return list(map(xxhash.xxh3_64.intdigest, hashers))


def _put(out: _TarOut, pieces: list[memoryview], lengths: npt.NDArray[np.int64]) -> None:
    """Hand the pieces to ``out`` in writes of about :data:`_FLUSH` bytes."""
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, np.arange(_FLUSH, int(ends[-1]), _FLUSH), side="right")
    at = 0
    for cut in [*np.unique(cuts).tolist(), len(pieces)]:
        if cut > at:
            out.parts.extend(pieces[at:cut])
            out.flush()
            at = cut


def _components(layout: ShardLayout, got: _Picked) -> list[list[Component]]:
    """The members of each taken sample: extension, data offset from the sample's first
    byte (past the header lengths), size and name."""
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
        for i in got.taken
    ]


def _taken_members(
    layout: ShardLayout, got: _Picked
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The members of the taken samples: how many each has, and their numbers (layout
    order), sample after sample."""
    taken = np.array(got.taken, np.int64)
    firsts = layout.firsts
    counts = firsts[taken + 1] - firsts[taken]
    return counts, spread(firsts[taken], counts)


def _dali_index(layout: ShardLayout, got: _Picked, counts: Ints, flat: Ints) -> bytes | None:
    """The DALI index file of the taken samples (None: it cannot describe them): the
    bytes of :func:`~shardex.format.dali_index.dali_index_bytes`, each line's text built
    by Arrow over all members at once."""
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
    starts = np.repeat(np.array(got.offsets, np.int64), counts)
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
    if layout.names_have_whitespace(flat):
        version = VERSION_WITHOUT_NAMES
    else:
        version = VERSION
        names = layout.names_of(flat).cast(pa.large_string())
        fields += [space, names]
    fields.append(string_array(ends, one))
    nothing = string_array(np.zeros(0, np.uint8), np.zeros(m + 1, np.int64))
    lines = pc.binary_join_element_wise(*fields, nothing)  # no separator: the fields hold it
    data, offsets = binary_buffers(lines)
    head = f"{version} {len(counts)}\n".encode()
    return head + data[offsets[0] : offsets[-1]].tobytes()


def _member_spans(
    layout: ShardLayout, got: _Picked, counts: Ints, flat: Ints
) -> MemberSpans | None:
    """Where each taken sample's key and members lie (the split's index-members rows);
    None when they hold too many extensions for one (see MAX_MEMBER_COLUMNS)."""
    if _plain_names(layout, got, flat):
        return _plain_spans(layout, got, counts, flat)
    return MemberSpans.of(
        [
            member_row([(name, at, size) for _, at, size, name in parts])
            for parts in _components(layout, got)
        ]
    )


def _plain_names(layout: ShardLayout, got: _Picked, flat: npt.NDArray[np.int64]) -> bool:
    """Whether every taken member's name is ``KEY.EXT`` as a reader splits it (see
    :func:`~shardex.format.index.member_row`): within ustar's 100-byte name field, the
    key's last path part without a dot, the extension not empty and without a slash.
    Then a sample's key lies at 0 in its first member's name, and each member's
    extension is its own (what member_row finds, without a Python loop per member)."""
    if len(flat) and int(layout.name_len[flat].max()) > 100:
        return False
    codes = np.unique(layout.ext_codes[flat]).tolist()
    if any(not layout.ext_names[c] or "/" in layout.ext_names[c] for c in codes):
        return False
    data, offsets = gathered(layout.key_data, layout.key_offsets, np.array(got.taken, np.int64))
    keys = string_array(data, offsets)
    return not pc.any(pc.match_substring_regex(keys, r"\.[^/]*$")).as_py()


def _plain_spans(layout: ShardLayout, got: _Picked, counts: Ints, flat: Ints) -> MemberSpans | None:
    """:meth:`MemberSpans.of` for samples of :func:`_plain_names`, with numpy."""
    n = len(got.taken)
    # one column per extension, in order of first appearance (equal names share one)
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
    key_len = np.diff(layout.key_offsets)[np.array(got.taken, np.int64)]
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


#: Bytes gathered before one write (few large writes instead of one per member).
_FLUSH: Final = 4 << 20
#: Parts gathered before one write: a few ``writev`` calls' worth (IOV_MAX is 1024).
_FLUSH_PARTS: Final = 4096


def write_shard(job: ShardJob) -> ShardWritten:
    """Write the tar and its Parquet sidecar (each appears only when complete), or keep
    them when resuming and they verify. Each candidate's bytes are read once: checked,
    hashed and appended."""
    if job.candidates.spill is not None:
        job = dataclasses.replace(job, candidates=job.candidates.loaded())
    old = _existing(job) if job.resume or job.alternate else None
    if old is None and job.alternate is not None:
        return write_shard(_elsewhere(job))
    layout = _layout(job)
    candidates = job.candidates
    source = ByteSource(candidates.members)
    # members on object storage are fetched ahead, but only those of the candidates the
    # shard holds when every one is good: the rest are the next shard's to fetch
    planned = plan_bounds(candidates.sizes, job.samples_per_shard, job.max_shard_bytes)
    if planned and any("://" in name for name in candidates.members.path_names):  # objects
        ahead = layout.source[: layout.firsts[planned[0][1]]]
        source.expect(ahead[ahead >= 0].tolist())
    try:
        with contextlib.ExitStack() as stack:
            out = _TarOut(job, stack, writing=old is None)
            fast = _fill_inline(job, layout, out, source) if old is None else None
            got = fast if fast is not None else _fill(job, layout, source, out, old)
            out.parts.append(END_OF_ARCHIVE)
            if got.taken or not out.writing:
                out.flush()
    except _Mismatch:
        return write_shard(_elsewhere(job))
    finally:
        source.close()
    done = _written(job, layout, got, shard_checksum(out.whole))
    if not got.taken:
        return done
    counts, flat = _taken_members(layout, got)
    index = _dali_index(layout, got, counts, flat) if job.dali_index_path else None
    index_path = job.dali_index_path if index is not None else None
    done = dataclasses.replace(
        done, dali_index=index_path, members=_member_spans(layout, got, counts, flat)
    )
    if old is not None:
        # the tar itself is hashed too: its sidecar may be whole while its bytes are not
        if old.size == got.size and old.table.equals(done.table) and _tar_holds(job, done.checksum):
            kept = dataclasses.replace(done, metadata_checksum=old.checksum)
            if job.alternate is None:
                _keep_index(job.storage, index_path, index)
                return kept
            if _holds(job.storage, index_path, index):
                return kept
        return write_shard(_elsewhere(job))
    # The sidecar goes last: a resumed export takes a shard whose sidecar exists as written.
    if index_path is not None and index is not None:
        job.storage.put(index_path, index)
    with job.storage.open_writer(job.parquet_path) as out_parquet:
        sidecar = parquet_file(out_parquet)
        pq.write_table(done.table, sidecar, compression="zstd")
    return dataclasses.replace(done, metadata_checksum=sidecar.checksum)


def _written(job: ShardJob, layout: ShardLayout, got: _Picked, checksum: str) -> ShardWritten:
    """The record of a shard (its sidecar rows, index arrays, what was skipped)."""
    offsets = np.array(got.offsets, np.uint64)
    lengths = np.array(got.lengths, np.uint32)
    sums = np.array(got.sums, np.uint64)
    taken = np.array(got.taken, np.int64)
    firsts = layout.firsts
    names = layout.names_of(np.where(firsts[taken + 1] > firsts[taken], firsts[taken], -1))
    keys: memoryview = layout.key_data.data
    at = layout.key_offsets
    views = map(keys.__getitem__, map(slice, at[taken].tolist(), at[taken + 1].tolist()))
    hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, views), np.uint64, len(taken))
    table = _sidecar(job, taken, names, offsets, lengths, sums)
    return ShardWritten(
        got.size,
        checksum,
        offsets,
        lengths,
        sums,
        table,
        tar_path=job.tar_path,
        parquet_path=job.parquet_path,
        consumed=got.consumed,
        complete=got.full or job.candidates.last,
        skipped=tuple(got.skipped),
        key_hashes=hashes,
    )


def _elsewhere(job: ShardJob) -> ShardJob:
    """The job that writes the shard again: in place, or under its alternate paths when
    the committed export names its paths (keeping a shard left there if it verifies)."""
    if job.alternate is None:
        return dataclasses.replace(job, resume=False)
    tar, parquet, idx = job.alternate
    return dataclasses.replace(
        job,
        tar_path=tar,
        parquet_path=parquet,
        dali_index_path=idx if job.dali_index_path else None,
        alternate=None,
        resume=True,
    )


def _tar_holds(job: ShardJob, checksum: str) -> bool:
    """Whether the tar left at ``job.tar_path`` has this whole-file checksum."""
    whole = xxhash.xxh3_64()
    try:
        for chunk in job.storage.iter_chunks(job.tar_path):
            whole.update(chunk)
    except (ShardexError, OSError):
        return False
    return shard_checksum(whole) == checksum


def _holds(storage: Storage, path: str | None, data: bytes | None) -> bool:
    """Whether an object holds exactly ``data`` (no object asked for: True)."""
    if path is None or data is None:
        return True
    try:
        return storage.get(path) == data
    except (ShardexError, OSError):
        return False


def _keep_index(storage: Storage, path: str | None, index: bytes | None) -> None:
    """Rewrite a kept shard's index file unless it already holds these bytes (one small
    read, against an upload when it does)."""
    if not _holds(storage, path, index):
        storage.put(path, index)  # type: ignore[arg-type]  # _holds: both are set


@dataclass(frozen=True, slots=True)
class _Existing:
    size: int
    table: pa.Table
    ends: list[int]
    sums: list[int]
    checksum: str


def _existing(job: ShardJob) -> _Existing | None:
    """The shard an interrupted export left, if both of its files are there."""
    try:
        size = job.storage.size(job.tar_path)
        data = job.storage.get(job.parquet_path)
        table = pq.read_table(arrow_reader(data))
    except (ShardexError, pa.ArrowInvalid, OSError):
        return None
    if "sample_checksum" not in table.column_names:
        return None
    ends = pc.add(table.column("sample_offset"), table.column("sample_length")).to_pylist()
    sums = table.column("sample_checksum").to_pylist()
    return _Existing(size, table, ends, sums, shard_checksum(xxhash.xxh3_64(data)))


def _same_prefix(old: _Existing | None, i: int, end: int, checksum: int) -> bool:
    """Whether sample i, ending at byte ``end``, matches the existing sidecar's record."""
    return old is not None and i < len(old.ends) and old.ends[i] == end and old.sums[i] == checksum


def _sidecar(
    job: ShardJob,
    picked: npt.NDArray[np.int64],
    member_names: pa.Array,
    offsets: npt.NDArray[np.uint64],
    lengths: npt.NDArray[np.uint32],
    sums: npt.NDArray[np.uint64],
) -> pa.Table:
    """The Parquet rows of a shard: NeMo's columns, typed metadata, byte ranges."""
    rows = job.candidates.rows.take(int_array(picked, pa.int64()))
    n = rows.num_rows
    internal = {MEMBERS, JSON_COLUMN, "key", "original_path"}
    json_text = json_text_column(rows)
    front = {
        "key": rows.column("key"),
        "image_id": rows.column("key"),
        "tar_file": _repeated(job.tar_path, n),
        "member_name": member_names,
        "original_path": rows.column("original_path"),
        "metadata": json_text,
    }
    rest = {c: rows.column(c) for c in rows.column_names if c not in internal}
    tail = {
        "sample_index": int_array(
            np.arange(job.first_sample, job.first_sample + n, dtype=np.int64), pa.int64()
        ),
        "sample_offset": int_array(offsets.astype(np.uint64), pa.uint64()),
        "sample_length": int_array(lengths.astype(np.uint32), pa.uint32()),
        "sample_checksum": int_array(sums.astype(np.uint64), pa.uint64()),
    }
    return pa.table({**front, **rest, **tail})


def _repeated(text: str, n: int) -> pa.Array:
    """A string array of ``n`` times ``text`` (one copy of its bytes each)."""
    raw = np.frombuffer(text.encode(), np.uint8)
    data = np.tile(raw, n)
    return string_array(data, np.arange(n + 1, dtype=np.int64) * len(raw)).cast(pa.string())
