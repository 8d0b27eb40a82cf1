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

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import xxhash

from shardex.backends.base import (
    Backend,
    Capabilities,
    Check,
    OnShard,
    SplitPlan,
    StoredSample,
    unused_name,
)
from shardex.backends.webdataset.reader import ShardDataset
from shardex.contract import ExportConfig, FieldSpec, IndexInfo, ShardInfo, SplitInfo
from shardex.dataset import Dataset, ReopenedDataset
from shardex.errors import FormatError
from shardex.format.mapped import (
    KEYS_FILE,
    MAX_MEMBER_COLUMNS,
    MEMBERS_FILE,
    MEMBERS_VERSION,
    SAMPLES_FILE,
    checksum_seeds,
)
from shardex.storage.base import Storage

if TYPE_CHECKING:  # for writing only: opening an export imports none of these
    import numpy as np
    import numpy.typing as npt

    from shardex.backends.webdataset.writer import ShardJob, ShardWritten
    from shardex.format.index import MemberSpans
    from shardex.parallel import Runner


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
    def plain_reader(cls, config: ExportConfig, split: str, location: str) -> str | None:
        from shardex.backends.webdataset.lists import WIDS_FILE

        # wids parses its argument as a URL: "#" or "?" in a path cuts it short
        if not config.split(split).shards or "#" in location or "?" in location:
            return None
        index = f"{location}/{config.split_prefix(split)}{WIDS_FILE}"
        return f"wids.ShardListDataset({index!r})"

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

    def stored_samples(self, dataset: Dataset, keys: list[str]) -> Iterator[StoredSample] | None:
        assert isinstance(dataset, ShardDataset)  # what open() builds
        from shardex.backends.webdataset.stored import stored_samples

        return stored_samples(dataset, keys)

    writes_shards: ClassVar[bool] = True

    def write_split(
        self, storage: Storage, plan: SplitPlan, runner: Runner, on_shard: OnShard
    ) -> SplitInfo:
        import numpy as np

        from shardex.engine.shards import candidates, inline_candidates, write_shards
        from shardex.engine.split_index import IndexSink
        from shardex.format.index import build_samples

        split = plan.candidates
        if split is None:
            raise TypeError("the webdataset backend writes from plan.candidates")
        before = plan.previous
        first = len(before.shards) if before is not None else 0
        other_hash = second_hash(plan.name_hash)
        # one local worker: this process writes; a remote runner's tasks always do
        inline = split.inline() or (runner.workers == 1 and not runner.remote)
        pick = inline_candidates if inline else candidates
        base = before.num_samples if before is not None else 0  # appended samples go on

        def make_job(start: int, stop: int, first_sample: int, k: int) -> ShardJob:
            fields = pick(split, start, stop)
            return _job(storage, plan, first + k, other_hash, base + first_sample, fields)

        shards = list(before.shards) if before is not None else []
        discarded: list[ShardWritten] = []
        members = _members_of(storage, plan)
        with IndexSink() as index_out:
            if before is not None and before.index is not None:
                index_out.add(*_old_index(storage, before.index))
            if members is not None:
                for part, checksums in members:
                    index_out.add_members(part, checksums)
            for done in write_shards(
                split,
                make_job,
                runner,
                plan.samples_per_shard,
                plan.max_shard_bytes,
                inline=inline,
                on_discard=discarded.append,
            ):
                if done.skipped and plan.on_skip is not None:
                    plan.on_skip(list(done.skipped))
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
                number = np.full(done.num_samples, len(shards) - 1, np.uint32)
                records = build_samples(number, done.offsets, done.lengths, done.checksums)
                index_out.add(records, done.key_hashes)
                if members is not None and done.members is None:
                    members = None  # more extensions than rows have columns for
                elif members is not None and done.members is not None:
                    index_out.add_members(done.members, done.checksums)
                on_shard(done.table, done.num_bytes)
            _remove_discarded(storage, discarded, shards, plan.existing)
            if not index_out.num_samples and before is None:
                # every sample skipped: the split is not exported
                return SplitInfo(num_samples=0, num_bytes=0, shards=(), index=None)
            if members is not None and len(index_out.member_columns()) > MAX_MEMBER_COLUMNS:
                members = None  # reads parse the headers (see MAX_MEMBER_COLUMNS)
            index = IndexInfo(
                unused_name(f"{plan.prefix}{SAMPLES_FILE}", plan.existing),
                unused_name(f"{plan.prefix}{KEYS_FILE}", plan.existing),
                None
                if members is None
                else unused_name(f"{plan.prefix}{MEMBERS_FILE}", plan.existing),
            )
            index_out.put(storage, index.samples, index.keys)
            if index.members is not None:
                index_out.put_members(storage, index.members)
            num_samples = index_out.num_samples
        return SplitInfo(
            num_samples=num_samples,
            num_bytes=sum(s.num_bytes for s in shards),
            shards=tuple(shards),
            index=index,
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
    fields: dict[str, Any],
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
        with_label=plan.with_label,
        samples_per_shard=plan.samples_per_shard,
        max_shard_bytes=plan.max_shard_bytes,
        first_sample=first_sample,
        check=plan.check,
        resume=plan.resume,
        dali_index_path=f"{stem}.idx",
        alternate=(f"{other}.tar", f"{other}.parquet", f"{other}.idx") if held else None,
        seeded=checksum_seeds(plan.format_version),
        **fields,
    )


def _members_of(
    storage: Storage, plan: SplitPlan
) -> list[tuple[MemberSpans, npt.NDArray[np.uint64]]] | None:
    """The member spans (with their samples' checksums) to extend with each written
    shard's: the committed split's, or none yet; None where the split gets no
    ``index-members.npy`` (format versions before 3, and an append to a split written
    without one)."""

    from shardex.format.index import (
        SAMPLE_DTYPE,
        check_member_rows,
        first_damaged_row,
        spans_of_rows,
    )

    if plan.format_version < MEMBERS_VERSION:
        return None
    before = plan.previous
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
    import numpy as np

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
    import numpy as np

    from shardex.format.index import SAMPLE_DTYPE

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
