"""Writing one tar shard and its Parquet sidecar.

A sample's members are written back to back: the source members in order (the image
first), then ``KEY.cls`` (the label as ASCII digits) and ``KEY.json`` (scalar metadata).
The sample's byte range runs from its first header to the end of its last member's
padding; its checksum covers exactly that range. Beside the tar goes DALI's index file of
the members (see :mod:`shardex.format.dali_index`), computed from the same layout.
"""

from __future__ import annotations

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

from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.errors import BadSampleError, ShardexError
from shardex.format.dali_index import Component, dali_index_bytes
from shardex.format.index import ABSENT, MAX_MEMBER_COLUMNS, MemberSpans, member_row
from shardex.format.tables import arrow_reader, parquet_file, shard_checksum
from shardex.format.tar import BLOCK, END_OF_ARCHIVE, encode_members, member_header
from shardex.planning import plan_bounds
from shardex.rows import (
    JSON_COLUMN,
    LABEL_FIELD,
    ByteSource,
    Members,
    SpillSlice,
    json_text_column,
)
from shardex.sample_check import SampleCheck, image_problem, refusal
from shardex.sources.base import MEMBERS
from shardex.storage.base import Storage


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

    ``rows`` are the candidates' metadata (``key``, ``original_path``, ``label``, ``_json``,
    metadata columns; no members), ``members`` their members (candidate ``i`` is sample
    ``member_rows[i]`` there) and ``sizes`` their planned tar bytes. The shard takes good
    candidates in order until it holds ``samples_per_shard`` samples or the next would
    pass ``max_shard_bytes``; bad ones are skipped (or refuse the export). ``last``: the
    candidates run to the end of the split (else more candidates exist beyond them, and a
    shard that ran out of candidates before it was full reports itself incomplete).

    With ``resume``, a shard whose tar and sidecar already exist is kept when the sidecar's
    keys, byte ranges and checksums equal those of the samples it should hold (the source
    is read and hashed, nothing is uploaded); otherwise it is written again.
    """

    storage: Storage
    tar_path: str
    parquet_path: str
    rows: pa.Table
    members: Members
    member_rows: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    with_label: bool
    samples_per_shard: int
    max_shard_bytes: int | None = None
    #: The sample number (in the split) of the shard's first sample.
    first_sample: int = 0
    last: bool = True
    check: SampleCheck = dataclasses.field(default_factory=SampleCheck)
    resume: bool = False
    dali_index_path: str | None = None
    #: Where the candidates are when the job does not carry them (``rows`` and
    #: ``members`` are then empty): a slice of a spill file the writer reads itself.
    spill: SpillSlice | None = None
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


class _Layout:
    """The tar members of a job's candidates: names, headers and payloads, built for all
    candidates at once (numpy over the members; one Python object per member only where
    the write loop takes it: no Python loop per member here)."""

    def __init__(self, job: ShardJob) -> None:
        n = job.rows.num_rows
        members = job.members
        self.keys: list[str] = job.rows.column("key").to_pylist()
        rows = np.asarray(job.member_rows, np.int64)
        counts = members.starts[rows + 1] - members.starts[rows]
        # the members the writer adds after a sample's own: KEY.cls, then KEY.json
        extras = [(field, _inline(values)) for field, values in _extra_values(job, n)]
        has = [np.fromiter((v is not None for v in vs), bool, n) for _, vs in extras]
        per = counts + sum((h.astype(np.int64) for h in has), np.zeros(n, np.int64))
        firsts = np.zeros(n + 1, np.int64)
        np.cumsum(per, out=firsts[1:])
        total = int(firsts[-1])
        owner = np.repeat(np.arange(n, dtype=np.int64), per)
        # source members: candidate i's k-th member is members.starts[rows[i]] + k
        within = np.arange(total, dtype=np.int64) - firsts[owner]
        own = within < counts[owner]
        source = np.where(own, members.starts[rows][owner] + within, -1)
        ext_codes = np.empty(total, np.int64)
        sizes = np.empty(total, np.int64)
        ext_codes[own] = members.ext_codes[source[own]]
        sizes[own] = members.size[source[own]]
        ext_names = [*members.ext_names, *(field for field, _ in extras)]
        payloads: list[int | bytes] = source.tolist()
        at = counts.copy()
        for k, ((_, values), present) in enumerate(zip(extras, has, strict=True)):
            which = np.flatnonzero(present)
            where = firsts[which] + at[which]
            ext_codes[where] = len(members.ext_names) + k
            datas = [b for b in (values[i] for i in which.tolist()) if b is not None]
            sizes[where] = np.fromiter(map(len, datas), np.int64, len(datas))
            for t, data in zip(where.tolist(), datas, strict=True):
                payloads[t] = data
            at += present
        names_of = np.array(ext_names, object)
        #: Per member: its extension, and a member of ``members`` or the bytes themselves.
        self.exts: list[str] = names_of[ext_codes].tolist()
        self.payloads = payloads
        self.sizes: list[int] = sizes.tolist()
        self.firsts: list[int] = firsts.tolist()
        keys_of = np.array(self.keys, object)[owner].tolist() if total else []
        self.names = [f"{k}.{e}" for k, e in zip(keys_of, self.exts, strict=True)]
        raw = [m.encode() for m in self.names]
        self.headers, starts_ = encode_members(raw, sizes)
        self.header_starts: list[int] = starts_.tolist()
        view = self.headers
        hs = self.header_starts
        #: Per member: its header bytes and the zeros after its data.
        self.heads = [view[hs[t] : hs[t + 1]] for t in range(total)]
        self.pads = [_PADS[p] for p in (-sizes % BLOCK).tolist()]
        image = np.array(
            [e.rpartition(".")[2].lower() in IMAGE_EXTENSIONS for e in ext_names], bool
        )
        self.is_image: list[bool] = (image[ext_codes] & own).tolist() if total else []
        self.pieces = self._pieces()
        # arrays for the index files of the samples taken (see _Taken)
        self.owner = owner
        self.np_firsts = firsts
        self.np_sizes = sizes
        self.ext_codes = ext_codes
        self.ext_names = ext_names
        hlen = np.diff(starts_)
        length = hlen + sizes + (-sizes % BLOCK)
        before = np.zeros(total + 1, np.int64)
        np.cumsum(length, out=before[1:])
        #: Per member: where its data starts, counted from its sample's first byte.
        self.data_at = before[:-1] - before[firsts[:-1]][owner] + hlen
        #: Per candidate: its bytes in the tar (headers, data, padding).
        self.sample_bytes: list[int] = (before[firsts[1:]] - before[firsts[:-1]]).tolist()
        self.name_len = np.fromiter(map(len, raw), np.int64, total)

    def _pieces(self) -> list[list[bytes | int]]:
        """Per candidate, its tar bytes as the writer puts them out: the bytes known
        before reading (headers, padding, the members the writer adds) joined between
        the source members, which stand as their numbers (``~j`` for an image, which is
        checked as it is read). A JPEG with its label is three parts: header, image,
        padding + the label's header, bytes and padding."""
        heads, pads, payloads, is_image = self.heads, self.pads, self.payloads, self.is_image
        firsts = self.firsts
        out: list[list[bytes | int]] = []
        for i in range(len(firsts) - 1):
            pieces: list[bytes | int] = []
            known: list[bytes | memoryview] = []
            for t in range(firsts[i], firsts[i + 1]):
                known.append(heads[t])
                p = payloads[t]
                if isinstance(p, int):
                    pieces.append(b"".join(known))
                    pieces.append(~p if is_image[t] else p)
                    known = []
                else:
                    known.append(p)
                known.append(pads[t])
            if known:
                pieces.append(b"".join(known))
            out.append(pieces)
        return out


def _extra_values(job: ShardJob, n: int) -> list[tuple[str, list[Any]]]:
    """The values of the members the writer adds, per candidate (None: no member)."""
    out: list[tuple[str, list[Any]]] = []
    if job.with_label:
        out.append((LABEL_FIELD, job.rows.column("label").to_pylist()))
    if JSON_COLUMN in job.rows.column_names:
        out.append(("json", job.rows.column(JSON_COLUMN).to_pylist()))
    return out


def _inline(values: list[Any]) -> list[bytes | None]:
    """A member's bytes from its value: bytes as they are, anything else as ASCII text."""
    return [v if v is None or isinstance(v, bytes) else str(v).encode() for v in values]


#: The zeros after a member's data, by their count.
_PADS: Final = tuple(bytes(p) for p in range(BLOCK))


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
        update = self.whole.update
        for part in self.parts:
            update(part)
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
    job: ShardJob, layout: _Layout, source: ByteSource, out: _TarOut, old: _Existing | None
) -> _Picked:
    """Take good candidates in order until the shard is full; append each to ``out``.
    Each member's bytes are read once: checked (images), appended and hashed. This loop
    runs once per sample: it holds only what must be done per sample."""
    got = _Picked()
    pieces_of, sizes, lengths_of = layout.pieces, job.sizes.tolist(), layout.sample_bytes
    cap, limit, check = job.max_shard_bytes, job.samples_per_shard, job.check
    taken, offsets, lengths, sums = got.taken, got.offsets, got.lengths, got.sums
    read, hasher = source.read, xxhash.xxh3_64
    used, pos, seed = len(END_OF_ARCHIVE), 0, job.first_sample if job.seeded else None
    parts = out.parts
    for i in range(job.rows.num_rows):
        count = len(taken)
        if count >= limit or (cap is not None and count and used + sizes[i] > cap):
            got.full = True
            break
        got.consumed = i + 1
        reason = None
        start = len(parts)
        for p in pieces_of[i]:
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


def _bad(job: ShardJob, layout: _Layout, i: int, reason: str, got: _Picked) -> None:
    """A bad candidate: refuse the export, or record it and go on."""
    original = str(job.rows.column("original_path")[i].as_py())
    if job.check.on_error == "error":
        raise BadSampleError(refusal(original, reason), reason=reason)
    got.skipped.append({"key": layout.keys[i], "original_path": original, "reason": reason})


def _components(layout: _Layout, got: _Picked) -> list[list[Component]]:
    """The members of each taken sample: extension, data offset from the sample's first
    byte (past the header lengths), size and name."""
    hstarts, firsts, sizes = layout.header_starts, layout.firsts, layout.sizes
    out: list[list[Component]] = []
    for i in got.taken:
        parts: list[Component] = []
        at = 0
        for t in range(firsts[i], firsts[i + 1]):
            at += hstarts[t + 1] - hstarts[t]
            size = sizes[t]
            parts.append((layout.exts[t], at, size, layout.names[t]))
            at += size + (-size % BLOCK)
        out.append(parts)
    return out


def _taken_members(
    layout: _Layout, got: _Picked
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The members of the taken samples: how many each has, and their numbers (layout
    order), sample after sample."""
    taken = np.array(got.taken, np.int64)
    firsts = layout.np_firsts
    counts = firsts[taken + 1] - firsts[taken]
    ends = np.cumsum(counts)
    flat = (
        np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
        - np.repeat(ends - counts, counts)
        + np.repeat(firsts[taken], counts)
    )
    return counts, flat


def _dali_index(
    layout: _Layout, got: _Picked, counts: npt.NDArray[np.int64], flat: npt.NDArray[np.int64]
) -> bytes | None:
    """The DALI index file of the taken samples (None: it cannot describe them)."""
    starts = np.repeat(np.array(got.offsets, np.int64), counts)
    members = flat.tolist()
    return dali_index_bytes(
        counts.tolist(),
        [layout.exts[t] for t in members],
        (starts + layout.data_at[flat]).tolist(),
        layout.np_sizes[flat].tolist(),
        [layout.names[t] for t in members],
    )


def _member_spans(
    layout: _Layout, got: _Picked, counts: npt.NDArray[np.int64], flat: npt.NDArray[np.int64]
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


def _plain_names(layout: _Layout, got: _Picked, flat: npt.NDArray[np.int64]) -> bool:
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
    keys = layout.keys
    return not any("." in keys[i].rpartition("/")[2] for i in got.taken)


def _plain_spans(
    layout: _Layout, got: _Picked, counts: npt.NDArray[np.int64], flat: npt.NDArray[np.int64]
) -> MemberSpans | None:
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
    key_len = np.fromiter((len(layout.keys[i].encode()) for i in got.taken), np.int64, n)
    spans[:, 1] = np.where(counts > 0, key_len, ABSENT)
    spans[sample, 2 + 2 * col] = layout.data_at[flat]
    spans[sample, 3 + 2 * col] = layout.np_sizes[flat]
    cells = sample * max(len(order), 1) + col
    if len(np.unique(cells)) != len(cells):  # a repeated extension: readers parse those
        dup = np.ones(len(cells), bool)
        dup[np.unique(cells, return_index=True)[1]] = False
        spans[sample[dup], 1] = ABSENT
        # the last of equal extensions holds the cell, as in MemberSpans.of
        last = np.unique(cells[::-1], return_index=True)[1]
        keep = len(cells) - 1 - last
        spans[sample[keep], 2 + 2 * col[keep]] = layout.data_at[flat][keep]
        spans[sample[keep], 3 + 2 * col[keep]] = layout.np_sizes[flat][keep]
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
    if job.spill is not None:
        rows, members, sizes = job.spill.read_sized()  # sizes: rows from the object store
        every = np.arange(rows.num_rows, dtype=np.int64)
        job = dataclasses.replace(job, rows=rows, members=members, member_rows=every, spill=None)
        job = job if sizes is None else dataclasses.replace(job, sizes=sizes)
    old = _existing(job) if job.resume or job.alternate else None
    if old is None and job.alternate is not None:
        return write_shard(_elsewhere(job))
    layout = _Layout(job)
    source = ByteSource(job.members)
    # members on object storage are fetched ahead, but only those of the candidates the
    # shard holds when every one is good: the rest are the next shard's to fetch
    planned = plan_bounds(job.sizes, job.samples_per_shard, job.max_shard_bytes)
    if planned and any("://" in name for name in job.members.path_names):  # objects
        ahead = layout.payloads[: layout.firsts[planned[0][1]]]
        source.expect(p for p in ahead if isinstance(p, int))
    try:
        with contextlib.ExitStack() as stack:
            out = _TarOut(job, stack, writing=old is None)
            got = _fill(job, layout, source, out, old)
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


def _written(job: ShardJob, layout: _Layout, got: _Picked, checksum: str) -> ShardWritten:
    """The record of a shard (its sidecar rows, index arrays, what was skipped)."""
    offsets = np.array(got.offsets, np.uint64)
    lengths = np.array(got.lengths, np.uint32)
    sums = np.array(got.sums, np.uint64)
    firsts = layout.firsts
    names = [layout.names[firsts[i]] if firsts[i + 1] > firsts[i] else "" for i in got.taken]
    hashes = np.fromiter(
        (xxhash.xxh3_64_intdigest(layout.keys[i].encode()) for i in got.taken),
        np.uint64,
        len(got.taken),
    )
    table = _sidecar(job, np.array(got.taken, np.int64), names, offsets, lengths, sums)
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
        complete=got.full or job.last,
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
    member_names: list[str],
    offsets: npt.NDArray[np.uint64],
    lengths: npt.NDArray[np.uint32],
    sums: npt.NDArray[np.uint64],
) -> pa.Table:
    """The Parquet rows of a shard: NeMo's columns, typed metadata, byte ranges."""
    rows = job.rows.take(pa.array(picked, pa.int64()))
    n = rows.num_rows
    internal = {MEMBERS, JSON_COLUMN, "key", "original_path"}
    json_text = json_text_column(rows)
    front = {
        "key": rows.column("key"),
        "image_id": rows.column("key"),
        "tar_file": pa.array([job.tar_path] * n, pa.string()),
        "member_name": pa.array(member_names, pa.string()),
        "original_path": rows.column("original_path"),
        "metadata": json_text,
    }
    rest = {c: rows.column(c) for c in rows.column_names if c not in internal}
    tail = {
        "sample_index": pa.array(np.arange(job.first_sample, job.first_sample + n), pa.int64()),
        "sample_offset": pa.array(offsets, pa.uint64()),
        "sample_length": pa.array(lengths, pa.uint32()),
        "sample_checksum": pa.array(sums, pa.uint64()),
    }
    return pa.table({**front, **rest, **tail})
