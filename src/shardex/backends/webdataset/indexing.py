"""A split's index files (``index-samples.npy``, ``index-keys.npy``,
``index-members.npy``) built from its shards as they complete: in this process from the
shards' records (:class:`IndexOut`), or, when shards are written by tasks on other
machines, by one task that reads the parts those tasks staged in the output
(:func:`merge_index`; :class:`StageShard` is what a shard task runs). Either way the
files are byte for byte the same.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.backends.webdataset.index_sink import IndexSink
from shardex.backends.webdataset.writer import ShardJob, ShardWritten, write_shard
from shardex.contract import IndexInfo, SplitInfo
from shardex.errors import FormatError
from shardex.format.index import (
    MAX_MEMBER_COLUMNS,
    SAMPLE_DTYPE,
    MemberSpans,
    build_samples,
    check_member_rows,
    first_damaged_row,
    spans_of_rows,
)
from shardex.format.mapped import MEMBERS_VERSION
from shardex.storage.base import Storage
from shardex.storage.staging import put_part, read_parts


class IndexOut:
    """A split's index records, key hashes and member spans, collected shard by shard
    after the committed split's (when appending); :meth:`put` writes the files. Use as a
    context manager: its scratch space goes whatever happens."""

    def __init__(self, storage: Storage, before: SplitInfo | None, format_version: int) -> None:
        self._sink = IndexSink()
        try:
            members = _members_of(storage, before, format_version)
            if before is not None and before.index is not None:
                self._sink.add(*_old_index(storage, before.index))
            for part, checksums in members or ():
                self._sink.add_members(part, checksums)
        except BaseException:
            self._sink.close()
            raise
        #: False once the split gets no ``index-members.npy`` (see :func:`_members_of`).
        self.members = members is not None

    def __enter__(self) -> IndexOut:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sink.close()

    @property
    def num_samples(self) -> int:
        return self._sink.num_samples

    def add(
        self,
        shard: int,
        offsets: npt.NDArray[np.uint64],
        lengths: npt.NDArray[np.uint32],
        checksums: npt.NDArray[np.uint64],
        key_hashes: npt.NDArray[np.uint64],
        spans: MemberSpans | None,
    ) -> None:
        """The samples of the split's shard number ``shard``."""
        number = np.full(len(offsets), shard, np.uint32)
        self._sink.add(build_samples(number, offsets, lengths, checksums), key_hashes)
        if spans is None:
            self.members = False  # more extensions than rows have columns for
        elif self.members:
            self._sink.add_members(spans, checksums)

    def put(self, storage: Storage, index: IndexInfo) -> bool:
        """Write the files (``index-members.npy`` only where the split gets one, which is
        returned: reads parse the headers past :data:`MAX_MEMBER_COLUMNS` columns)."""
        members = self.members and len(self._sink.member_columns()) <= MAX_MEMBER_COLUMNS
        self._sink.put(storage, index.samples, index.keys)
        if members and index.members is not None:
            self._sink.put_members(storage, index.members)
        return members


@dataclass(frozen=True, slots=True)
class StagedShard(ShardWritten):
    """What a shard task on another machine returns: the shard's files and checksums,
    and where its metadata rows and index arrays are staged (``part``, None where it
    wrote no sample); its arrays and rows are empty."""

    count: int = 0
    part: str | None = None

    @property
    def num_samples(self) -> int:
        return self.count


_EMPTY_U64 = np.zeros(0, np.uint64)


@dataclass(frozen=True, slots=True)
class StageShard:
    """Write a shard (:func:`write_shard`), stage its rows and arrays under ``staging``,
    and return only a :class:`StagedShard`."""

    staging: str

    def __call__(self, job: ShardJob) -> StagedShard:
        done = write_shard(job)
        part = None
        if done.num_samples and done.complete:  # an incomplete shard is discarded
            arrays: dict[str, npt.NDArray[Any]] = {
                "offsets": done.offsets,
                "lengths": done.lengths,
                "checksums": done.checksums,
                "key_hashes": done.key_hashes,
            }
            if done.members is not None:
                arrays["spans"] = done.members.spans
                arrays["exts"] = np.array(list(done.members.exts), dtype=np.str_)
            part = put_part(job.storage, self.staging, done.table, arrays)
        return StagedShard(
            done.num_bytes,
            done.checksum,
            _EMPTY_U64,
            np.zeros(0, np.uint32),
            _EMPTY_U64,
            pa.table({}),
            dali_index=done.dali_index,
            tar_path=done.tar_path,
            parquet_path=done.parquet_path,
            metadata_checksum=done.metadata_checksum,
            consumed=done.consumed,
            complete=done.complete,
            skipped=done.skipped,
            count=done.num_samples,
            part=part,
        )


@dataclass(frozen=True, slots=True)
class IndexJob:
    """A split's index files from its staged parts: ``parts`` are (shard number, part)."""

    storage: Storage
    before: SplitInfo | None
    format_version: int
    parts: tuple[tuple[int, str], ...]
    index: IndexInfo


def merge_index(job: IndexJob) -> tuple[int, bool]:
    """Write the job's index files (a part in memory at a time); the samples they index,
    and whether ``index-members.npy`` was written."""
    with (
        read_parts(job.storage, (name for _, name in job.parts), table=False) as parts,
        IndexOut(job.storage, job.before, job.format_version) as out,
    ):
        for (shard, _), part in zip(job.parts, parts, strict=True):
            a = part.arrays
            spans = None
            if "spans" in a:
                spans = MemberSpans(tuple(a["exts"].tolist()), a["spans"])
            out.add(shard, a["offsets"], a["lengths"], a["checksums"], a["key_hashes"], spans)
        members = out.put(job.storage, job.index)
        return out.num_samples, members


def with_members(index: IndexInfo, members: bool) -> IndexInfo:
    return index if members else dataclasses.replace(index, members=None)


def _members_of(
    storage: Storage, before: SplitInfo | None, format_version: int
) -> list[tuple[MemberSpans, npt.NDArray[np.uint64]]] | None:
    """The member spans (with their samples' checksums) to extend with each written
    shard's: the committed split's, or none yet; None where the split gets no
    ``index-members.npy`` (format versions before 3, and an append to a split written
    without one)."""
    if format_version < MEMBERS_VERSION:
        return None
    if before is None or before.index is None:
        return []
    if before.index.members is None:
        return None
    where = storage.join(before.index.members)
    rows = _load_npy(storage, before.index.members, "member index")
    records = _load_npy(storage, before.index.samples, "sample index")
    check_member_rows(rows, where, before.num_samples)
    if records.dtype != SAMPLE_DTYPE or records.shape != (before.num_samples,):
        raise FormatError(
            f"{storage.join(before.index.samples)}: expected {before.num_samples} records of "
            f"{SAMPLE_DTYPE}, found {records.dtype} {records.shape}"
        )
    # The new file seals every row again: a damaged row carried over would pass its new
    # check, and reads would slice wrong fields out of good bytes without an error.
    bad = first_damaged_row(rows, records["checksum"])
    if bad is not None:
        raise FormatError(
            f"row {bad} of {where} fails its check: the file is damaged, and appending "
            "would carry the damage into the new index unnoticed; `shardex verify` reports "
            "it, an export with mode='overwrite' repairs it"
        )
    return [(spans_of_rows(rows), records["checksum"])]


def _load_npy(storage: Storage, path: str, what: str) -> npt.NDArray[Any]:
    """A committed ``.npy`` file read whole; a hostile header is a one-line FormatError."""
    data = storage.get(path)  # its storage errors stay storage errors
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)  # type: ignore[no-any-return]
    except Exception as exc:  # numpy raises what it meets: ValueError, TokenError, ...
        raise FormatError(f"{storage.join(path)}: not a valid {what} file ({exc})") from exc


def _old_index(
    storage: Storage, index: IndexInfo
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.uint64]]:
    """The committed records of a split, and its key hashes in sample order. Files that
    do not hold one record and one key per sample are refused: the append would carry
    them into the new index (a hostile header must not become a huge allocation)."""
    where = storage.join(index.keys)
    samples = _load_npy(storage, index.samples, "sample index")
    table = _load_npy(storage, index.keys, "key index")
    repair = "`shardex verify` reports it, an export with mode='overwrite' repairs it"
    if samples.dtype != SAMPLE_DTYPE or samples.ndim != 1:
        raise FormatError(
            f"{storage.join(index.samples)}: expected a 1-d array of {SAMPLE_DTYPE}, found "
            f"{samples.dtype} with shape {samples.shape}; {repair}"
        )
    n = len(samples)
    if table.dtype != np.uint64 or table.shape != (2, n):
        raise FormatError(
            f"{where}: expected uint64 of shape (2, {n}), found {table.dtype} {table.shape}; "
            f"{repair}"
        )
    rows = table[1]
    if n and (rows.max() >= n or np.bincount(rows.astype(np.int64), minlength=n).max() != 1):
        raise FormatError(
            f"{where}: its sample numbers are not each sample once: the file is damaged, and "
            f"appending would carry the damage into the new index; {repair}"
        )
    hashes = np.empty(n, dtype=np.uint64)
    hashes[rows] = table[0]
    return samples, hashes
