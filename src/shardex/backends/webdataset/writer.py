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

from shardex.backends.webdataset.layout import ShardLayout, int_array, string_array
from shardex.backends.webdataset.shard_index import member_indexes
from shardex.backends.webdataset.vectorised import (
    file_views,
    images_good,
    member_views,
    sample_pieces,
    sample_sums,
)
from shardex.errors import BadSampleError, ShardexError
from shardex.format.index import MemberSpans
from shardex.format.tables import arrow_reader, parquet_file, shard_checksum
from shardex.format.tar import END_OF_ARCHIVE
from shardex.planning import plan_bounds
from shardex.refs.candidates import Candidates
from shardex.refs.members import JSON_COLUMN, json_text_column
from shardex.refs.scan import MEMBERS
from shardex.sample_check import SampleCheck, image_problem, refusal
from shardex.storage.base import Storage
from shardex.storage.fetch.bytes import ByteSource


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


def _fill_inline(
    job: ShardJob, layout: ShardLayout, out: _TarOut, source: ByteSource | None, k: int
) -> _Picked | None:
    """:func:`_fill` for a shard whose source members are all in this process's memory
    (Arrow buffers) or all whole local files (with ``source``: an image folder's, read
    back to back into one buffer of at most :data:`_FILES_BYTES`), done over all its
    samples at once: the images' headers checked with numpy, the pieces taken as views
    and each sample hashed without a Python frame per sample. None (nothing written)
    when a taken candidate is bad, or cannot be taken this way: :func:`_fill` then
    writes the shard, one sample at a time (the files read here are not read again)."""
    check = job.check
    if check.validate == "decode" or not k:
        return None
    ts = layout.own_members[: layout.own_from[k]]
    js = layout.source[ts]
    members = job.candidates.members
    if members.inline[js].all():
        got = member_views(members, js, layout.sizes[ts])
    elif source is not None:
        got = file_views(source, js, layout.sizes[ts])
    else:
        return None
    if got is None:
        return None
    views, spots = got
    images = np.flatnonzero(layout.is_image[ts])
    if len(images) and not images_good(views, spots, images, check):
        return None
    # the tar: each sample's pieces (skeleton runs between its source members, which
    # are views of their buffers), hashed and written as they are
    columns = sample_pieces(layout, k, views)
    sums = sample_sums(columns, job.first_sample if job.seeded else None)
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
    candidates, members = job.candidates, job.candidates.members
    layout = ShardLayout(candidates, job.with_label)
    source = ByteSource(members)
    # the candidates the shard takes when every one is good (as _fill decides); members
    # on object storage are fetched ahead for those only: the rest are the next shard's
    planned = plan_bounds(candidates.sizes, job.samples_per_shard, job.max_shard_bytes)
    take = planned[0][1] if planned else 0
    if take and any("://" in name for name in members.path_names):  # objects
        ahead = layout.source[: layout.firsts[take]]
        source.expect(ahead[ahead >= 0].tolist())
    try:
        with contextlib.ExitStack() as stack:
            out = _TarOut(job, stack, writing=old is None)
            fast = _fill_inline(job, layout, out, source, take) if old is None else None
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
    taken = np.array(got.taken, np.int64)
    index, spans = member_indexes(layout, taken, got.offsets, dali=bool(job.dali_index_path))
    index_path = job.dali_index_path if index is not None else None
    done = dataclasses.replace(done, dali_index=index_path, members=spans)
    if old is not None:
        # the tar itself is hashed too: its sidecar may be whole while its bytes are not
        if old.size == got.size and old.table.equals(done.table) and _tar_holds(job, done.checksum):
            # a kept shard's index file is rewritten unless it already holds these bytes
            # (one small read, against an upload when it does); never at alternate paths
            if not _holds(job.storage, index_path, index):
                if job.alternate is not None:
                    return write_shard(_elsewhere(job))
                job.storage.put(index_path, index)  # type: ignore[arg-type]  # _holds: set
            return dataclasses.replace(done, metadata_checksum=old.checksum)
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
