"""metadata.parquet written by a task from the parts remote shard tasks staged in the
output, so no per-sample byte passes through the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from shardex.contract import ExportConfig
from shardex.engine.commit import MetadataSink, old_metadata
from shardex.storage.base import Storage
from shardex.storage.staging import Part, read_parts


@dataclass(frozen=True, slots=True)
class MetadataJob:
    """metadata.parquet from steps ``("old", SPLIT)`` (committed rows) or ``("part", NAME)``."""

    storage: Storage
    name: str
    steps: tuple[tuple[str, str], ...]
    previous: ExportConfig | None = None


def write_metadata(job: MetadataJob) -> str | None:
    """Write the job's metadata.parquet; its whole-file checksum."""
    storage = job.storage
    old = (
        old_metadata(storage, job.previous) if any(kind == "old" for kind, _ in job.steps) else None
    )
    names = (what for kind, what in job.steps if kind == "part")
    sink = MetadataSink(storage, job.name)
    try:
        with read_parts(storage, names) as parts:
            _write_rows(job, old, parts, sink)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    return sink.checksum


def _write_rows(
    job: MetadataJob, old: pa.Table | None, parts: Iterator[Part], sink: MetadataSink
) -> None:
    import pyarrow.compute as pc

    for kind, what in job.steps:
        if kind == "old":
            assert old is not None  # a step "old" only where the export has the file
            rows = old.filter(pc.equal(old.column("split"), what))
        else:
            rows = next(parts).table
        sink(rows)
