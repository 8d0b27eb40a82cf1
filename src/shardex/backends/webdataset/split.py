"""Writing a split of tar shards: jobs and their two possible names, kept and discarded
shards, and the split's index files."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardex.backends.base import SplitPlan, SplitWriter, StagedRows, unused_name
from shardex.backends.webdataset.indexing import (
    IndexJob,
    IndexOut,
    StagedShard,
    StageShard,
    merge_index,
    with_members,
)
from shardex.backends.webdataset.names import second_hash, shard_stem
from shardex.backends.webdataset.writer import ShardJob, ShardWritten, write_shard
from shardex.contract import IndexInfo, ShardInfo, SplitInfo
from shardex.errors import ExportError
from shardex.format.mapped import KEYS_FILE, MEMBERS_FILE, SAMPLES_FILE, checksum_seeds
from shardex.storage.base import Storage

if TYPE_CHECKING:
    from shardex.parallel import Runner
    from shardex.refs.candidates import Candidates


class TarSplit(SplitWriter):
    """A split's tar shards. Appends continue the committed numbering; remote tasks stage
    their rows and index arrays, merged by a task (never through this process)."""

    def __init__(self, storage: Storage, plan: SplitPlan, *, remote: bool) -> None:
        self.storage, self.plan = storage, plan
        before = plan.previous
        self._first = len(before.shards) if before is not None else 0
        self._base = before.num_samples if before is not None else 0
        self._other_hash = second_hash(plan.name_hash)
        self._staged = plan.staging is not None and remote
        self.write: Any = StageShard(plan.staging) if self._staged and plan.staging else write_shard
        self.shards: list[ShardInfo] = list(before.shards) if before is not None else []
        self._discarded: list[ShardWritten] = []
        self._parts: list[tuple[int, str]] = []
        self._stack = contextlib.ExitStack()
        self._index = None
        if not self._staged:
            self._index = self._stack.enter_context(IndexOut(storage, before, plan.format_version))

    def job(self, candidates: Candidates, first_sample: int, number: int) -> ShardJob:
        """Of a shard's two names (usual, :func:`second_hash`), one the committed export
        names is kept if it holds exactly these samples, else the other is written:
        nothing committed is written over."""
        plan, number = self.plan, self._first + number
        hashes = (plan.name_hash, self._other_hash)
        usual, second = (shard_stem(plan.prefix, h, number) for h in hashes)
        committed = second if f"{second}.tar" in plan.existing else usual
        other = second if committed == usual else usual
        held = f"{committed}.tar" in plan.existing
        return ShardJob(
            self.storage,
            f"{committed}.tar",
            f"{committed}.parquet",
            candidates,
            with_label=plan.with_label,
            samples_per_shard=plan.samples_per_shard,
            max_shard_bytes=plan.max_shard_bytes,
            first_sample=self._base + first_sample,
            check=plan.check,
            resume=plan.resume,
            dali_index_path=f"{committed}.idx",
            alternate=(f"{other}.tar", f"{other}.parquet", f"{other}.idx") if held else None,
            seeded=checksum_seeds(plan.format_version),
        )

    def add(self, done: ShardWritten) -> tuple[pa.Table | StagedRows, int]:
        self.shards.append(
            ShardInfo(
                done.tar_path,
                done.num_samples,
                done.num_bytes,
                done.checksum,
                done.parquet_path,
                done.dali_index,
                done.metadata_checksum,
            )
        )
        number = len(self.shards) - 1
        if isinstance(done, StagedShard):
            assert done.part is not None  # a complete shard of samples is staged
            self._parts.append((number, done.part))
            return StagedRows(done.part, done.num_samples), done.num_bytes
        assert self._index is not None
        self._index.add(
            number, done.offsets, done.lengths, done.checksums, done.key_hashes, done.members
        )
        return done.table, done.num_bytes

    def discard(self, done: ShardWritten) -> None:
        self._discarded.append(done)

    def finish(self, runner: Runner) -> SplitInfo:
        plan, shards = self.plan, self.shards
        # replaced shards' files go, unless a kept or committed shard has their name
        kept = {p for s in shards for p in (s.path, s.metadata, s.dali_index) if p}
        for done in self._discarded:
            for path in (done.tar_path, done.parquet_path, done.dali_index):
                if done.num_samples and path and path not in kept and path not in plan.existing:
                    self.storage.delete(path)
        num_samples = sum(s.num_samples for s in shards)
        if not num_samples:  # every sample skipped: the split is not exported
            return SplitInfo(num_samples=0, num_bytes=0, shards=(), index=None)
        index = IndexInfo(
            unused_name(f"{plan.prefix}{SAMPLES_FILE}", plan.existing),
            unused_name(f"{plan.prefix}{KEYS_FILE}", plan.existing),
            unused_name(f"{plan.prefix}{MEMBERS_FILE}", plan.existing),
        )
        if self._index is not None:
            members = self._index.put(self.storage, index)
        else:
            job = IndexJob(
                self.storage, plan.previous, plan.format_version, tuple(self._parts), index
            )
            indexed, members = next(iter(runner.imap(merge_index, [job])))
            if indexed != num_samples:
                raise ExportError(
                    f"the index of split {plan.split!r} holds {indexed} samples, its "
                    f"shards {num_samples}: staged parts are missing; export again"
                )
        return SplitInfo(
            num_samples=num_samples,
            num_bytes=sum(s.num_bytes for s in shards),
            shards=tuple(shards),
            index=with_members(index, members),
        )

    def close(self) -> None:
        self._stack.close()
