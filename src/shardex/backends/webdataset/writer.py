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
from shardex.format.dali_index import Component, DaliIndex
from shardex.format.index import MemberSpans, member_row
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

_ZEROS: Final = bytes(BLOCK)


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
    candidates at once (vectorised headers; no Python object per byte range)."""

    def __init__(self, job: ShardJob) -> None:
        n = job.rows.num_rows
        members = job.members
        self.keys: list[str] = job.rows.column("key").to_pylist()
        labels = job.rows.column("label").to_pylist() if job.with_label else [None] * n
        jsons: list[bytes | None] = (
            job.rows.column(JSON_COLUMN).to_pylist()
            if JSON_COLUMN in job.rows.column_names
            else [None] * n
        )
        #: Per member: its extension, and a member of ``members`` or the bytes themselves.
        self.exts: list[str] = []
        self.payloads: list[int | bytes] = []
        self.sizes: list[int] = []
        sizes = self.sizes
        self.firsts = [0] * (n + 1)
        starts, size = members.starts, members.size
        codes, ext = members.ext_codes, members.ext_names
        for i in range(n):
            row = int(job.member_rows[i])
            for j in range(int(starts[row]), int(starts[row + 1])):
                self.exts.append(ext[codes[j]])
                self.payloads.append(j)
                sizes.append(int(size[j]))
            for field, value in ((LABEL_FIELD, labels[i]), ("json", jsons[i])):
                if value is not None:
                    data = value if isinstance(value, bytes) else str(value).encode()
                    self.exts.append(field)
                    self.payloads.append(data)
                    sizes.append(len(data))
            self.firsts[i + 1] = len(self.exts)
        firsts = self.firsts
        self.names = [
            f"{self.keys[i]}.{self.exts[t]}"
            for i in range(n)
            for t in range(firsts[i], firsts[i + 1])
        ]
        self.headers, starts_ = encode_members(
            [m.encode() for m in self.names], np.array(sizes, np.int64)
        )
        self.header_starts: list[int] = starts_.tolist()
        image: dict[str, bool] = {}
        self.is_image = [
            isinstance(p, int)
            and image.setdefault(e, e.rpartition(".")[2].lower() in IMAGE_EXTENSIONS)
            for e, p in zip(self.exts, self.payloads, strict=True)
        ]


class _TarOut:
    """The shard's bytes on their way out: gathered into large writes, hashed whole;
    the object is opened with the first write (a shard of no good sample is no object).
    ``writing=False`` only hashes (a shard left by an interrupted export is checked)."""

    def __init__(self, job: ShardJob, stack: contextlib.ExitStack, writing: bool) -> None:
        self._job, self._stack, self.writing = job, stack, writing
        self._out: Any = None
        self.whole = xxhash.xxh3_64()
        self.buf = bytearray()

    def flush(self) -> None:
        self.whole.update(self.buf)
        if self.writing:
            if self._out is None:
                self._out = self._stack.enter_context(
                    self._job.storage.open_writer(self._job.tar_path)
                )
            self._out.write(self.buf)
        self.buf = bytearray()


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


def _read_sample(
    layout: _Layout, source: ByteSource, first: int, stop: int, check: SampleCheck
) -> tuple[list[bytes | memoryview], str | None]:
    """A candidate's member bytes (each read once), or why it is bad."""
    datas: list[bytes | memoryview] = []
    payloads, is_image = layout.payloads, layout.is_image
    try:
        for t in range(first, stop):
            p = payloads[t]
            data = p if isinstance(p, bytes) else source.read(p)
            if is_image[t]:
                reason = image_problem(data, check)
                if reason:
                    return datas, reason
            datas.append(data)
    except BadSampleError as exc:
        return datas, exc.reason or str(exc)
    return datas, None


def _fill(
    job: ShardJob, layout: _Layout, source: ByteSource, out: _TarOut, old: _Existing | None
) -> _Picked:
    """Take good candidates in order until the shard is full; append each to ``out``."""
    got = _Picked()
    headers = memoryview(layout.headers)
    hstarts, firsts = layout.header_starts, layout.firsts
    cap, limit, sizes = job.max_shard_bytes, job.samples_per_shard, job.sizes
    used, pos, seed = len(END_OF_ARCHIVE), 0, job.first_sample if job.seeded else None
    for i in range(job.rows.num_rows):
        count = len(got.taken)
        if count >= limit or (cap is not None and count and used + int(sizes[i]) > cap):
            got.full = True
            break
        got.consumed = i + 1
        first, stop = firsts[i], firsts[i + 1]
        datas, reason = _read_sample(layout, source, first, stop, job.check)
        if reason:
            _bad(job, layout, i, reason, got)
            continue
        buf = out.buf
        start = len(buf)
        for t, data in zip(range(first, stop), datas, strict=True):
            buf += headers[hstarts[t] : hstarts[t + 1]]
            buf += data
            pad = -len(data) % BLOCK
            if pad:
                buf += _ZEROS[:pad]
        with memoryview(buf) as view, view[start:] as sample:
            digest = xxhash.xxh3_64_intdigest(sample, 0 if seed is None else seed + count)
        length = len(buf) - start
        got.taken.append(i)
        got.offsets.append(pos)
        got.lengths.append(length)
        got.sums.append(digest)
        pos += length
        used += int(sizes[i])
        if old is not None and not _same_prefix(old, count, pos, digest):
            raise _Mismatch
        if len(buf) >= _FLUSH:
            out.flush()
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


def _dali_index(got: _Picked, components: list[list[Component]]) -> DaliIndex:
    """The DALI index of the taken samples."""
    dali = DaliIndex()
    for start, parts in zip(got.offsets, components, strict=True):
        dali.add(start, parts)
    return dali


def _member_spans(components: list[list[Component]]) -> MemberSpans | None:
    """Where each taken sample's key and members lie (the split's index-members rows);
    None when they hold too many extensions for one (see MAX_MEMBER_COLUMNS)."""
    return MemberSpans.of(
        [member_row([(name, at, size) for _, at, size, name in parts]) for parts in components]
    )


#: Bytes gathered before one write (few large writes instead of one per member).
_FLUSH: Final = 4 << 20


def write_shard(job: ShardJob) -> ShardWritten:
    """Write the tar and its Parquet sidecar (each appears only when complete), or keep
    them when resuming and they verify. Each candidate's bytes are read once: checked,
    hashed and appended."""
    if job.spill is not None:
        rows, members = job.spill.read()
        every = np.arange(rows.num_rows, dtype=np.int64)
        job = dataclasses.replace(job, rows=rows, members=members, member_rows=every, spill=None)
    old = _existing(job) if job.resume or job.alternate else None
    if old is None and job.alternate is not None:
        return write_shard(_elsewhere(job))
    layout = _Layout(job)
    source = ByteSource(job.members)
    # members on object storage are fetched ahead, but only those of the candidates the
    # shard holds when every one is good: the rest are the next shard's to fetch
    planned = plan_bounds(job.sizes, job.samples_per_shard, job.max_shard_bytes)
    ahead = layout.payloads[: layout.firsts[planned[0][1]]] if planned else []
    source.expect(p for p in ahead if isinstance(p, int))
    try:
        with contextlib.ExitStack() as stack:
            out = _TarOut(job, stack, writing=old is None)
            got = _fill(job, layout, source, out, old)
            out.buf += END_OF_ARCHIVE
            if got.taken or not out.writing:
                out.flush()
    except _Mismatch:
        return write_shard(_elsewhere(job))
    finally:
        source.close()
    done = _written(job, layout, got, shard_checksum(out.whole))
    if not got.taken:
        return done
    components = _components(layout, got)
    index = _dali_index(got, components).to_bytes() if job.dali_index_path else None
    index_path = job.dali_index_path if index is not None else None
    done = dataclasses.replace(done, dali_index=index_path, members=_member_spans(components))
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
