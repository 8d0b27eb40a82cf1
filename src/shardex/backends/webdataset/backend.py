"""The default backend: WebDataset tar shards + Parquet sidecars + a random-access index.

Layout of a split ``S`` (see docs/format.md; ``layout="flat"``: the one split's files at
the top level, without ``S/``)::

    S/images-{hash}-000000.tar        plain POSIX tar, a sample's members consecutive
    S/images-{hash}-000000.parquet    one row per sample: NeMo columns, metadata, byte range
    S/images-{hash}-000000.idx        DALI's index of the tar's members (wds2idx format)
    S/index-samples.npy               24 bytes per sample: offset, checksum, shard, length
    S/index-keys.npy                  sorted key hashes -> sample number
    S/index-members.npy               where each sample's members lie (format version 3)
    S/shards.wids.json, S/shards.txt  the tars' names, for wids and webdataset (lists.py)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ClassVar

import xxhash

from shardex.backends.base import (
    Backend,
    Capabilities,
    Check,
    OnShard,
    SplitPlan,
    StagedRows,
    StoredSample,
    unused_name,
)
from shardex.backends.webdataset.reader import ShardDataset
from shardex.contract import ExportConfig, FieldSpec, IndexInfo, ShardInfo, SplitInfo
from shardex.dataset import Dataset, ReopenedDataset
from shardex.errors import ExportError, ShardexError
from shardex.format.mapped import (
    KEYS_FILE,
    MEMBERS_FILE,
    SAMPLES_FILE,
    checksum_seeds,
)
from shardex.storage.base import Storage

if TYPE_CHECKING:  # for writing only: opening an export imports none of these
    from shardex.backends.webdataset.writer import ShardJob, ShardWritten
    from shardex.engine.candidates import Candidates
    from shardex.parallel import Runner
    from shardex.sources.base import MapRunner


def shard_stem(prefix: str, name_hash: str, number: int) -> str:
    """``{prefix}images-{hash}-{NNNNNN}`` (``prefix``: ``S/``, or ``""`` in the flat
    layout): the path of a shard without its extension."""
    return f"{prefix}images-{name_hash}-{number:06d}"


class WebDatasetBackend(Backend):
    """Tar shards that stock WebDataset and DALI read, with one-read random access."""

    name: ClassVar[str] = "webdataset"
    description: ClassVar[str] = "tar shards + Parquet + mmap index (default)"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True,
        streaming=True,
        remote=True,
        append=True,
        checked_reads=True,
        dali=True,
        flat_layout=True,
    )
    files: ClassVar[tuple[str, ...]] = (
        # (no folder: the flat layout; see shardex.backends.ownership for when those count)
        r"(?:[^/]+/)?images-[0-9a-f]+-\d{6}\.(?:tar|parquet|idx)",
        # (".pending" names: the leftovers of shardex versions that renamed after committing)
        r"(?:[^/]+/)?index-(?:samples|keys|members)(?:\.pending|\.2)?\.npy",
        r"(?:[^/]+/)?shards\.(?:wids\.json|txt)",
    )
    key_storage: ClassVar[str | None] = "tar"
    dataset: ClassVar[type[ReopenedDataset]] = ShardDataset

    @classmethod
    def field_storage(cls, field: FieldSpec) -> str:
        return f"tar:{field.name}"  # a tar member's extension, not a column

    @classmethod
    def plain_reader(
        cls, config: ExportConfig, split: str, location: str, storage: Storage
    ) -> str | None:
        from shardex.backends.webdataset.lists import LIST_FILE, WIDS_FILE

        # wids and webdataset parse their argument as a URL: "#" or "?" in a path cuts it
        if not config.split(split).shards or "#" in location or "?" in location:
            return None
        folder = f"{location}/{config.split_prefix(split)}"
        if _longest_member(storage, config, split) <= 100:
            return f"wids.ShardListDataset({folder + WIDS_FILE!r})"
        # wids reads ustar's 100-byte name field alone (no GNU long name, no prefix):
        # webdataset reads the tars with tarfile, which applies them
        if "://" in location:  # a URL needs webdataset's "pipe:" commands
            return None
        return (
            f"webdataset.WebDataset([{folder!r} + n for n in open({folder + LIST_FILE!r})"
            ".read().split()], shardshuffle=False)"
        )

    @classmethod
    def derived_files(cls, config: ExportConfig, split: str) -> dict[str, bytes]:
        from shardex.backends.webdataset.lists import shard_lists

        return shard_lists(config, split)

    def verify_split(
        self, storage: Storage, config: ExportConfig, split: str, check: Check
    ) -> None:
        # imported here: it loads pyarrow, which opening an export does not need
        from shardex.backends.webdataset.verify import verify_split

        verify_split(storage, config, split, check.report, check.deep, check.bar)

    def stored_samples(
        self, dataset: Dataset, key: Callable[[int], str], runner: MapRunner | None = None
    ) -> Iterator[StoredSample] | None:
        assert isinstance(dataset, ShardDataset)  # what open() builds
        from shardex.backends.webdataset.stored import stored_samples

        return stored_samples(dataset, key, runner)

    writes_shards: ClassVar[bool] = True

    def write_split(
        self, storage: Storage, plan: SplitPlan, runner: Runner, on_shard: OnShard
    ) -> SplitInfo:
        from shardex.backends.webdataset.indexing import (
            IndexJob,
            IndexOut,
            StagedShard,
            StageShard,
            merge_index,
            with_members,
        )
        from shardex.engine.shards import write_plan, writes_inline

        split = plan.candidates
        if split is None:
            raise TypeError("the webdataset backend writes from plan.candidates")
        before = plan.previous
        first = len(before.shards) if before is not None else 0
        other_hash = second_hash(plan.name_hash)
        inline = writes_inline(split, runner)
        base = before.num_samples if before is not None else 0  # appended samples go on
        # tasks on other machines stage their rows and index arrays in the output, and
        # tasks merge them: none of those bytes pass through this process
        staged = plan.staging is not None and runner.remote and not inline

        def make_job(candidates: Candidates, first_sample: int, k: int) -> ShardJob:
            return _job(storage, plan, first + k, other_hash, base + first_sample, candidates)

        shards = list(before.shards) if before is not None else []
        discarded: list[ShardWritten] = []
        parts: list[tuple[int, str]] = []
        index_out = None if staged else IndexOut(storage, before, plan.format_version)
        with contextlib.ExitStack() as stack:
            if index_out is not None:
                stack.enter_context(index_out)
            for done in write_plan(
                plan,
                split,
                make_job,
                runner,
                inline=inline,
                on_discard=discarded.append,
                write=StageShard(plan.staging) if staged and plan.staging else None,
            ):
                if not done.num_samples:  # the split's last candidates were all skipped
                    continue
                shards.append(
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
                if isinstance(done, StagedShard):
                    assert done.part is not None  # a complete shard of samples is staged
                    parts.append((len(shards) - 1, done.part))
                    on_shard(StagedRows(done.part, done.num_samples), done.num_bytes)
                    continue
                assert index_out is not None
                index_out.add(
                    len(shards) - 1,
                    done.offsets,
                    done.lengths,
                    done.checksums,
                    done.key_hashes,
                    done.members,
                )
                on_shard(done.table, done.num_bytes)
            _remove_discarded(storage, discarded, shards, plan.existing)
            num_samples = sum(s.num_samples for s in shards)
            if not num_samples:
                # every sample skipped: the split is not exported
                return SplitInfo(num_samples=0, num_bytes=0, shards=(), index=None)
            index = IndexInfo(
                unused_name(f"{plan.prefix}{SAMPLES_FILE}", plan.existing),
                unused_name(f"{plan.prefix}{KEYS_FILE}", plan.existing),
                unused_name(f"{plan.prefix}{MEMBERS_FILE}", plan.existing),
            )
            if index_out is not None:
                members = index_out.put(storage, index)
            else:
                job = IndexJob(storage, before, plan.format_version, tuple(parts), index)
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


def _remove_discarded(
    storage: Storage,
    discarded: list[ShardWritten],
    shards: list[ShardInfo],
    committed: frozenset[str],
) -> None:
    """Delete the files of shards written speculatively and then replaced, unless a kept
    shard now has their name (or the committed export names them: a shard kept on resume
    is the committed one)."""
    kept = {p for s in shards for p in (s.path, s.metadata, s.dali_index) if p}
    for done in discarded:
        if not done.num_samples:
            continue
        for path in (done.tar_path, done.parquet_path, done.dali_index):
            if path and path not in kept and path not in committed:
                storage.delete(path)


def second_hash(name_hash: str) -> str:
    """The name hash of a shard's second name (see :func:`_job`)."""
    return xxhash.xxh3_64(f"{name_hash}/2".encode()).hexdigest()[:12]


def _job(
    storage: Storage,
    plan: SplitPlan,
    number: int,
    other_hash: str,
    first_sample: int,
    candidates: Candidates,
) -> ShardJob:
    """The job of one shard. A shard has two possible names: its usual one and one with
    :func:`second_hash`. When the committed export names one of them, the job first keeps
    that shard if it holds exactly these samples; otherwise it writes the other name, so
    that nothing the committed config.yaml names is ever written over."""
    usual, second = (shard_stem(plan.prefix, h, number) for h in (plan.name_hash, other_hash))
    committed = second if f"{second}.tar" in plan.existing else usual
    other = second if committed == usual else usual
    held = f"{committed}.tar" in plan.existing
    stem = committed if held else usual
    from shardex.backends.webdataset.writer import ShardJob

    return ShardJob(
        storage,
        f"{stem}.tar",
        f"{stem}.parquet",
        candidates,
        with_label=plan.with_label,
        samples_per_shard=plan.samples_per_shard,
        max_shard_bytes=plan.max_shard_bytes,
        first_sample=first_sample,
        check=plan.check,
        resume=plan.resume,
        dali_index_path=f"{stem}.idx",
        alternate=(f"{other}.tar", f"{other}.parquet", f"{other}.idx") if held else None,
        seeded=checksum_seeds(plan.format_version),
    )


def _longest_member(storage: Storage, config: ExportConfig, split: str) -> int:
    """The longest tar member name of a split, in bytes, at most (its longest key, a dot
    and its longest extension); past any name's length where the metadata is unreadable."""
    import pyarrow.compute as pc

    from shardex.backends.metadata import read_metadata

    try:
        keys = read_metadata(storage, config, split).column("key")
    except ShardexError:
        return 1 << 16
    ext = max([len(f.name.encode()) for f in config.fields] + [len("json")])
    return int(pc.max(pc.binary_length(keys)).as_py() or 0) + 1 + ext
