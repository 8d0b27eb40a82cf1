"""Pass 2 of an export over its splits: each split planned and written through the
backend, metadata.parquet streamed as shards complete, skipped samples collected."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from shardex.backends.base import Backend, unused_name
from shardex.contract import (
    METADATA_FILE,
    ExportConfig,
    SplitInfo,
)
from shardex.engine.commit import MetadataSink, old_metadata
from shardex.engine.plan import plan_split, split_rows
from shardex.engine.prepare import Prepared
from shardex.errors import (
    ExportError,
)
from shardex.options import ExportOptions
from shardex.parallel import Runner
from shardex.progress import Progress
from shardex.storage import Storage


@dataclass(frozen=True, slots=True)
class Written:
    """What pass 2 wrote: the splits as config.yaml records them, their content digests,
    metadata.parquet's name and checksum, and every skipped sample (pass 1's first)."""

    splits: dict[str, SplitInfo]
    digests: list[str]
    metadata_file: str
    metadata_checksum: str | None
    skipped: list[dict[str, str]]


def write_splits(
    storage: Storage,
    backend: Backend,
    prep: Prepared,
    opts: ExportOptions,
    runner: Runner,
    bars: Progress,
    previous: ExportConfig | None,
    committed: frozenset[str] = frozenset(),
) -> Written:
    """Write every selected split through the backend, streaming metadata.parquet.

    When appending, the export's splits come first in their order, each followed by its
    new samples; its metadata rows are copied into the new metadata file. ``committed``:
    the files of the committed export, which no new file may replace.
    """
    names = [
        *(previous.splits if previous else ()),
        *(s for s in prep.splits if not previous or s not in previous.splits),
    ]
    bar = bars.export_task("writing shards", prep.num_rows)
    metadata_file = unused_name(METADATA_FILE, committed)
    sink = MetadataSink(storage, metadata_file)
    skipped = list(prep.skipped)

    def on_shard(shard_table: pa.Table, num_bytes: int = 0, /) -> None:
        try:
            sink(shard_table)
        except ValueError as exc:  # pyarrow: the schema differs from the rows before
            raise ExportError(f"the new samples' columns differ from the export's: {exc}") from exc
        bar.shard(shard_table.num_rows, num_bytes)

    def on_skip(records: list[dict[str, str]]) -> None:
        skipped.extend(records)
        bar.advance(len(records))

    old_meta = old_metadata(storage, previous)
    written: dict[str, SplitInfo] = {}
    digests: list[str] = []
    try:
        for split, rows in zip(names, split_rows(prep, names, backend), strict=True):
            before = previous.splits.get(split) if previous else None
            if old_meta is not None and before is not None:
                sink(old_meta.filter(pc.equal(old_meta.column("split"), split)))
            count = rows.num_rows if isinstance(rows, pa.Table) else rows.num_samples
            if count == 0 and before is not None:
                written[split] = before
                continue
            plan, digest = plan_split(rows, split, backend, prep, opts, before, committed, previous)
            digests.append(digest)
            plan = dataclasses.replace(plan, on_skip=on_skip)
            info = backend.write_split(storage, plan, runner, on_shard)
            if info.num_samples or before is not None:
                written[split] = info
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    return Written(written, digests, metadata_file, sink.checksum, skipped)
