"""A split's index files from its shards' records: here (:class:`IndexOut`), or by one
task from parts remote shard tasks staged (:func:`merge_index`); the same bytes either way."""

from __future__ import annotations

import dataclasses
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
from shardex.format.tables import read_npy
from shardex.storage.base import Storage
from shardex.storage.staging import put_part, read_parts


class IndexOut:
    """A split's index, collected shard by shard after the committed split's (appending).
    A context manager: its scratch goes with it."""

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
        number = np.full(len(offsets), shard, np.uint32)
        self._sink.add(build_samples(number, offsets, lengths, checksums), key_hashes)
        if spans is None:
            self.members = False  # too many extensions for a row
        elif self.members:
            self._sink.add_members(spans, checksums)

    def put(self, storage: Storage, index: IndexInfo) -> bool:
        """Write the files; return whether ``index-members.npy`` was among them."""
        members = self.members and len(self._sink.member_columns()) <= MAX_MEMBER_COLUMNS
        self._sink.put(storage, index.samples, index.keys)
        if members and index.members is not None:
            self._sink.put_members(storage, index.members)
        return members


@dataclass(frozen=True, slots=True)
class StagedShard(ShardWritten):
    """A remote shard task's result: files and checksums, and the staged ``part``."""

    count: int = 0
    part: str | None = None

    @property
    def num_samples(self) -> int:
        return self.count


_EMPTY_U64 = np.zeros(0, np.uint64)


@dataclass(frozen=True, slots=True)
class StageShard:
    """Write a shard, stage its rows and arrays under ``staging``, return a :class:`StagedShard`."""

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
    """A split's index files from its staged (shard number, part) ``parts``."""

    storage: Storage
    before: SplitInfo | None
    format_version: int
    parts: tuple[tuple[int, str], ...]
    index: IndexInfo


def merge_index(job: IndexJob) -> tuple[int, bool]:
    """Write the job's index files, a part at a time; (samples, members written)."""
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
    """The committed member spans and checksums to extend ([] if none yet); None where
    the split gets no ``index-members.npy`` (format < 3, or appending to one without)."""
    if format_version < MEMBERS_VERSION:
        return None
    if before is None or before.index is None:
        return []
    if before.index.members is None:
        return None
    where = storage.join(before.index.members)
    rows = read_npy(storage, before.index.members, "member index")
    records = read_npy(storage, before.index.samples, "sample index")
    check_member_rows(rows, where, before.num_samples)
    if records.dtype != SAMPLE_DTYPE or records.shape != (before.num_samples,):
        raise FormatError(
            f"{storage.join(before.index.samples)}: expected {before.num_samples} records of "
            f"{SAMPLE_DTYPE}, found {records.dtype} {records.shape}"
        )
    # rows are sealed again: a damaged row carried over would pass its new check
    bad = first_damaged_row(rows, records["checksum"])
    if bad is not None:
        raise FormatError(
            f"row {bad} of {where} fails its check: the file is damaged, and appending "
            "would carry the damage into the new index unnoticed; `shardex verify` reports "
            "it, an export with mode='overwrite' repairs it"
        )
    return [(spans_of_rows(rows), records["checksum"])]


def _old_index(
    storage: Storage, index: IndexInfo
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.uint64]]:
    """The committed records and key hashes in sample order, refused unless one of each
    per sample (an append would carry damage into the new index)."""
    where = storage.join(index.keys)
    samples = read_npy(storage, index.samples, "sample index")
    table = read_npy(storage, index.keys, "key index")
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
