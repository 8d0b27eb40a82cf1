"""Pass 2 of an export over its splits: each split planned and written through the
backend, metadata.parquet streamed as shards complete, skipped samples collected."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from shardex.backends.base import Backend, SplitPlan, StagedRows, unused_name
from shardex.contract import FORMAT_VERSION, METADATA_FILE, ExportConfig, SplitInfo
from shardex.engine.commit import MetadataSink, old_metadata
from shardex.engine.parts import MetadataJob, write_metadata
from shardex.engine.prepare import Prepared
from shardex.engine.shards import write_split
from shardex.options import ExportOptions
from shardex.parallel import Runner
from shardex.planning import name_hash
from shardex.progress import Progress
from shardex.refs.rows import SpilledRows
from shardex.sample_check import SampleCheck
from shardex.storage import Storage
from shardex.storage.staging import put_part


@dataclass(frozen=True, slots=True)
class Written:
    """What pass 2 wrote (skipped samples: pass 1's first)."""

    splits: dict[str, SplitInfo]
    digests: list[str]
    metadata_file: str
    metadata_checksum: str | None
    skipped: list[dict[str, str]]


class _Metadata:
    """metadata.parquet, streamed here as shards complete."""

    def __init__(self, storage: Storage, name: str, previous: ExportConfig | None) -> None:
        self._old = old_metadata(storage, previous)
        self._sink = MetadataSink(storage, name)
        self.checksum: str | None = None

    def old(self, split: str) -> None:
        if self._old is not None:
            self._sink(self._old.filter(pc.equal(self._old.column("split"), split)))

    def __call__(self, rows: pa.Table | StagedRows) -> None:
        assert isinstance(rows, pa.Table)  # a backend stages only when told where
        self._sink(rows)

    def commit(self, runner: Runner) -> None:
        del runner
        self._sink.commit()
        self.checksum = self._sink.checksum

    def abort(self) -> None:
        self._sink.abort()


class _StagedMetadata(_Metadata):
    """metadata.parquet written by a task from the parts remote shard tasks staged."""

    def __init__(
        self, storage: Storage, name: str, previous: ExportConfig | None, staging: str
    ) -> None:
        self._storage, self._name, self._previous = storage, name, previous
        self._staging = staging
        self._steps: list[tuple[str, str]] = []
        self.checksum = None

    def old(self, split: str) -> None:
        if self._previous is not None and self._previous.metadata_file:
            self._steps.append(("old", split))

    def __call__(self, rows: pa.Table | StagedRows) -> None:
        if isinstance(rows, pa.Table):  # a backend that does not stage: staged here
            part = put_part(self._storage, self._staging, rows, {})
            rows = StagedRows(part, rows.num_rows)
        self._steps.append(("part", rows.part))

    def commit(self, runner: Runner) -> None:
        job = MetadataJob(self._storage, self._name, tuple(self._steps), self._previous)
        self.checksum = next(iter(runner.imap(write_metadata, [job])))

    def abort(self) -> None:
        pass  # nothing written yet: the parts go with the run's staging


def write_splits(
    storage: Storage,
    backend: Backend,
    prep: Prepared,
    opts: ExportOptions,
    runner: Runner,
    bars: Progress,
    previous: ExportConfig | None,
    committed: frozenset[str] = frozenset(),
    staging: str | None = None,
) -> Written:
    """Write every selected split through the backend, streaming metadata.parquet.

    An append's splits come first, each followed by its new samples. ``committed``: files
    no new file may replace; ``staging``: where remote tasks stage rows and index arrays.
    """
    names = [
        *(previous.splits if previous else ()),
        *(s for s in prep.splits if not previous or s not in previous.splits),
    ]
    bar = bars.export_task("writing shards", prep.num_rows)
    metadata_file = unused_name(METADATA_FILE, committed)
    sink = (
        _Metadata(storage, metadata_file, previous)
        if staging is None
        else _StagedMetadata(storage, metadata_file, previous, staging)
    )
    skipped = list(prep.skipped)

    def on_shard(shard_table: pa.Table | StagedRows, num_bytes: int = 0, /) -> None:
        sink(shard_table)
        bar.shard(shard_table.num_rows, num_bytes)

    def on_skip(records: list[dict[str, str]]) -> None:
        skipped.extend(records)
        bar.advance(len(records))

    written: dict[str, SplitInfo] = {}
    digests: list[str] = []
    try:
        for split in names:
            rows = prep.spilled.get(split)  # none: an appended split without new samples
            before = previous.splits.get(split) if previous else None
            if before is not None:
                sink.old(split)
            if rows is None or rows.num_samples == 0:
                if before is not None:
                    written[split] = before
                continue
            digests.append(rows.digest)
            plan = _plan(rows, split, prep, opts, before, committed, previous, on_skip, staging)
            info = write_split(storage, backend, plan, runner, on_shard)
            if info.num_samples or before is not None:
                written[split] = info
        sink.commit(runner)
    except BaseException:
        sink.abort()
        raise
    return Written(written, digests, metadata_file, sink.checksum, skipped)


def _plan(
    rows: SpilledRows,
    split: str,
    prep: Prepared,
    opts: ExportOptions,
    before: SplitInfo | None,
    committed: frozenset[str],
    previous: ExportConfig | None,
    on_skip: Callable[[list[dict[str, str]]], None],
    staging: str | None,
) -> SplitPlan:
    """A split's plan: its candidates, their exact sizes in a shard and its name hash."""
    return SplitPlan(
        split,
        rows,
        name_hash(opts, split, rows.digest),
        prep.write_label,
        prep.fields,
        resume=opts.mode in ("resume", "overwrite", "append"),
        previous=before,
        existing=committed,
        format_version=previous.format_version if previous else FORMAT_VERSION,
        samples_per_shard=opts.samples_per_shard,
        max_shard_bytes=opts.max_shard_bytes,
        check=SampleCheck(opts.validate, opts.max_pixels, opts.on_error),
        flat=opts.layout == "flat",
        on_skip=on_skip,
        staging=staging,
    )
