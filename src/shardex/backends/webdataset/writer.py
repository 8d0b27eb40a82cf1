"""Writing one tar shard, its Parquet sidecar and its DALI index.

A sample is its source members, then ``KEY.cls`` and ``KEY.json``; its byte range runs
from its first header to its last member's padding, and its checksum covers exactly that.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
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
    resident_views,
    sample_pieces,
    sample_sums,
)
from shardex.errors import BadSampleError, ShardexError
from shardex.format.index import MemberSpans
from shardex.format.tables import PARQUET_WRITE, ParquetFile, arrow_reader, shard_checksum
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
    """One shard to write from its candidates (taken in order until full; bad ones skipped).

    With ``resume``, a shard left in place is kept when its sidecar and tar match the
    samples it should hold (the source is hashed, nothing uploaded).
    """

    storage: Storage
    tar_path: str
    parquet_path: str
    candidates: Candidates
    with_label: bool
    samples_per_shard: int
    max_shard_bytes: int | None = None
    first_sample: int = 0
    check: SampleCheck = dataclasses.field(default_factory=SampleCheck)
    resume: bool = False
    dali_index_path: str | None = None
    #: Set when the committed export names this shard's paths: a shard there is kept if
    #: it holds exactly these samples, else the shard goes to these (tar, parquet, idx).
    alternate: tuple[str, str, str] | None = None
    seeded: bool = True  # checksums seeded with sample numbers (format >= 2)


@dataclass(frozen=True, slots=True)
class ShardWritten:
    """What writing (or keeping) one shard produced (a ``ShardDone``)."""

    num_bytes: int
    checksum: str
    offsets: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint64]
    table: pa.Table
    dali_index: str | None = None
    tar_path: str = ""
    parquet_path: str = ""
    metadata_checksum: str | None = None
    consumed: int = 0
    complete: bool = True
    skipped: tuple[dict[str, str], ...] = ()
    key_hashes: npt.NDArray[np.uint64] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.uint64)
    )
    members: MemberSpans | None = None

    @property
    def num_samples(self) -> int:
        return len(self.offsets)


class _TarOut:
    """The shard's parts gathered into large uncopied writes (one ``writev`` locally) and
    hashed; the object opens with the first write. Writes run in order in one thread while
    the next parts are gathered, up to :data:`_IN_FLIGHT` at once; after a failed one, the
    rest are dropped unwritten and the first error is raised. ``writing=False`` only
    hashes."""

    def __init__(self, job: ShardJob, stack: contextlib.ExitStack, writing: bool) -> None:
        self._job, self._stack, self.writing = job, stack, writing
        self._out: Any = None
        self._thread: ThreadPoolExecutor | None = None
        self._writes: collections.deque[Future[None]] = collections.deque()
        self._failed = False
        self.whole = xxhash.xxh3_64()
        self.parts: list[bytes | bytearray | memoryview] = []
        self.pending = 0

    def flush(self) -> None:
        collections.deque(map(self.whole.update, self.parts), 0)  # no Python frame a part
        if self.writing:
            if self._out is None:
                self._out = self._stack.enter_context(
                    self._job.storage.open_writer(self._job.tar_path)
                )
                # entered after the writer, so left before it commits or aborts
                self._thread = self._stack.enter_context(ThreadPoolExecutor(1, "shardex-tar"))
                self._stack.push(self._left)
            self._wait(_IN_FLIGHT - 1)
            assert self._thread is not None
            self._writes.append(self._thread.submit(self._write, self.parts))
        self.parts = []
        self.pending = 0

    def _write(self, parts: list[bytes | bytearray | memoryview]) -> None:
        if self._failed:  # a write before this one failed: the writer is being aborted
            return
        try:
            self._out.write_parts(parts)
        except BaseException:
            self._failed = True
            raise

    def _wait(self, most: int) -> None:
        """Wait until at most ``most`` writes are in flight (the first error raised here,
        the writes queued behind it dropped)."""
        try:
            while len(self._writes) > most:
                self._writes.popleft().result()
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        self._failed = True
        for write in self._writes:
            write.cancel()
        self._writes.clear()

    def _left(self, kind: object, error: BaseException | None, trace: object) -> bool:
        """Leaving the shard: wait for its writes, or, on an error already raised, drop
        them (a write's own error then does not replace it)."""
        if error is None:
            self._wait(0)
        else:
            self._drop()
        return False


@dataclass(slots=True)
class _Picked:
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
    """Take good candidates in order until the shard is full, appending each to ``out``
    (each member read once). A per-sample loop: keep it lean."""
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
            if type(p) is int:  # a source member (~j: an image, checked)
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
        if old is not None and not (
            count < len(old.ends) and old.ends[count] == pos and old.sums[count] == digest
        ):
            raise _Mismatch
        if out.pending >= _FLUSH or len(parts) >= _FLUSH_PARTS:
            out.flush()
            parts = out.parts
    got.size = pos + len(END_OF_ARCHIVE)
    return got


def _bad(job: ShardJob, layout: ShardLayout, i: int, reason: str, got: _Picked) -> None:
    original = str(job.candidates.rows.column("original_path")[i].as_py())
    if job.check.on_error == "error":
        raise BadSampleError(refusal(original, reason), reason=reason)
    got.skipped.append({"key": layout.key(i), "original_path": original, "reason": reason})


def _fill_inline(
    job: ShardJob, layout: ShardLayout, out: _TarOut, source: ByteSource, k: int
) -> _Picked | None:
    """:func:`_fill` over all samples at once (no Python frame per sample), for members
    all in memory or all whole local files. None, nothing written, when a candidate is
    bad or cannot go this way: :func:`_fill` then writes the shard."""
    check = job.check
    if check.validate == "decode" or not k:
        return None
    ts = layout.own_members[: layout.own_from[k]]
    js = layout.source[ts]
    members = job.candidates.members
    if (members.inline[js] | members.pinned(js)).all():
        got = resident_views(source, js, layout.sizes[ts])
    else:
        got = file_views(source, js, layout.sizes[ts])
    if got is None:
        return None
    views, spots = got
    images = np.flatnonzero(layout.is_image[ts])
    if len(images) and not images_good(views, spots, images, check):
        return None
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
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, np.arange(_FLUSH, int(ends[-1]), _FLUSH), side="right")
    at = 0
    for cut in [*np.unique(cuts).tolist(), len(pieces)]:
        if cut > at:
            out.parts.extend(pieces[at:cut])
            out.flush()
            at = cut


_FLUSH: Final = 4 << 20  # bytes gathered before one write
_FLUSH_PARTS: Final = 4096
#: Writes queued at once (32 MiB): the next parts are gathered, checked and hashed while
#: the kernel takes these (an in-memory export against 1 at once: 0.95x the time over 20
#: interleaved runs, 0.78x to 1.13x over rounds of 8; benchmarks/RESULTS.md, session 23).
_IN_FLIGHT: Final = 8


def write_shard(job: ShardJob) -> ShardWritten:
    """Write the tar and its sidecar (each whole or absent), or keep them if they verify."""
    if job.candidates.spill is not None:
        job = dataclasses.replace(job, candidates=job.candidates.loaded())
    old = _existing(job) if job.resume or job.alternate else None
    if old is None and job.alternate is not None:
        return write_shard(_elsewhere(job))
    candidates, members = job.candidates, job.candidates.members
    layout = ShardLayout(candidates, job.with_label)
    source = ByteSource(members)
    # remote members are fetched ahead only for what the shard takes if all are good
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
        # the tar is hashed too: its sidecar may be whole while its bytes are not
        if old.size == got.size and old.table.equals(done.table) and _tar_holds(job, done.checksum):
            # rewrite the index file unless it holds these bytes (never at alternate paths)
            if not _holds(job.storage, index_path, index):
                if job.alternate is not None:
                    return write_shard(_elsewhere(job))
                job.storage.put(index_path, index)  # type: ignore[arg-type]  # _holds: set
            return dataclasses.replace(done, metadata_checksum=old.checksum)
        return write_shard(_elsewhere(job))
    # the sidecar last: a resume takes a shard whose sidecar exists as written
    if index_path is not None and index is not None:
        job.storage.put(index_path, index)
    with job.storage.open_writer(job.parquet_path) as out_parquet:
        sidecar = ParquetFile(out_parquet)
        pq.write_table(done.table, sidecar, **PARQUET_WRITE)
    return dataclasses.replace(done, metadata_checksum=sidecar.checksum)


def _written(job: ShardJob, layout: ShardLayout, got: _Picked, checksum: str) -> ShardWritten:
    """The shard's record and sidecar rows: NeMo's columns, typed metadata, byte ranges."""
    offsets = np.array(got.offsets, np.uint64)
    lengths = np.array(got.lengths, np.uint32)
    sums = np.array(got.sums, np.uint64)
    taken = np.array(got.taken, np.int64)
    firsts = layout.firsts
    keys: memoryview = layout.key_data.data
    at = layout.key_offsets
    views = map(keys.__getitem__, map(slice, at[taken].tolist(), at[taken + 1].tolist()))
    hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, views), np.uint64, len(taken))
    rows = job.candidates.rows.take(int_array(taken, pa.int64()))
    n = rows.num_rows
    tar = np.frombuffer(job.tar_path.encode(), np.uint8)
    tar_file = string_array(np.tile(tar, n), np.arange(n + 1, dtype=np.int64) * len(tar))
    front = {
        "key": rows.column("key"),
        "image_id": rows.column("key"),
        "tar_file": tar_file.cast(pa.string()),
        "member_name": layout.names_of(
            np.where(firsts[taken + 1] > firsts[taken], firsts[taken], -1)
        ),
        "original_path": rows.column("original_path"),
        "metadata": json_text_column(rows),
    }
    internal = {MEMBERS, JSON_COLUMN, "key", "original_path"}
    rest = {c: rows.column(c) for c in rows.column_names if c not in internal}
    tail = {
        "sample_index": int_array(np.arange(n, dtype=np.int64) + job.first_sample, pa.int64()),
        "sample_offset": int_array(offsets, pa.uint64()),
        "sample_length": int_array(lengths, pa.uint32()),
        "sample_checksum": int_array(sums, pa.uint64()),
    }
    return ShardWritten(
        got.size,
        checksum,
        offsets,
        lengths,
        sums,
        pa.table({**front, **rest, **tail}),
        tar_path=job.tar_path,
        parquet_path=job.parquet_path,
        consumed=got.consumed,
        complete=got.full or job.candidates.last,
        skipped=tuple(got.skipped),
        key_hashes=hashes,
    )


def _elsewhere(job: ShardJob) -> ShardJob:
    """The job that writes the shard again: in place, or at its alternate paths."""
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
    whole = xxhash.xxh3_64()
    try:
        for chunk in job.storage.iter_chunks(job.tar_path):
            whole.update(chunk)
    except (ShardexError, OSError):
        return False
    return shard_checksum(whole) == checksum


def _holds(storage: Storage, path: str | None, data: bytes | None) -> bool:
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
    """The shard an interrupted export left, if both its files are there."""
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
