"""Readers: the first stage of a pipeline, a source cut into batches of samples.

The driver only scans; the worker that runs a batch job reads its bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.pipeline.stage import Batch, Stage
from shardex.refs.scan import INVALID, MEMBERS, LeftOut, ScanResult
from shardex.sources import Source, open_source
from shardex.storage.fetch.bytes import MemberReader

#: Sample keys a reader fills; the rest of a sample is metadata.
READER_KEYS: tuple[str, ...] = ("key", "original_path", "split", "label", "image", "image_ext")


@dataclass(frozen=True, slots=True)
class BatchJob:
    number: int
    rows: pa.Table


class ReaderStage(Stage):
    """Reads a source (image folder, tars, table, existing export, ``demo``) in batches.

    Args:
        source: anything :func:`shardex.open_source` takes.
        batch_size: samples per batch (a unit of work for one worker).
    """

    name: ClassVar[str] = "read"
    produces = ("key", "original_path", "image", "image_ext")

    def __init__(
        self, source: str | os.PathLike[str] | Source | Mapping[str, Any], batch_size: int = 256
    ) -> None:
        self.source = open_source(source)
        self.batch_size = batch_size
        self._scan: ScanResult | None = None

    def params(self) -> dict[str, Any]:
        return {"source": self.source.uri, "kind": self.source.kind, "batch_size": self.batch_size}

    def scan(self) -> ScanResult:
        """The source's sample table (once), without the rows it marked unusable."""
        if self._scan is None:
            self._scan = _without_invalid(self.source.scan())
        return self._scan

    def jobs(self) -> Iterator[BatchJob]:
        table = self.scan().table
        for number, start in enumerate(range(0, table.num_rows, self.batch_size)):
            stop = min(start + self.batch_size, table.num_rows)
            # take() copies: a pickled slice would carry the whole table to the worker
            yield BatchJob(number, table.take(np.arange(start, stop)))

    def process(self, batch: Batch) -> Batch:
        return batch

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_scan": None}  # workers get rows in their jobs, not the scan


def _without_invalid(scan: ScanResult) -> ScanResult:
    table = scan.table
    if INVALID not in table.column_names:
        return scan
    invalid = table.column(INVALID)
    bad = table.filter(invalid.is_valid())
    columns = [bad.column(c).to_pylist() for c in ("original_path", INVALID, "key")]
    left_out = tuple(LeftOut(str(p), str(r), str(k)) for p, r, k in zip(*columns, strict=True))
    kept = table.filter(invalid.is_null()).drop_columns([INVALID])
    return ScanResult(kept, scan.label_names, scan.left_out + left_out)


def read_batch(rows: pa.Table) -> Batch:
    """The samples of a batch job: image bytes read, metadata typed."""
    reader = MemberReader()
    members = rows.column(MEMBERS).to_pylist()
    meta = rows.drop_columns([c for c in (MEMBERS, INVALID) if c in rows.column_names])
    out: Batch = []
    try:
        for row, ms in zip(meta.to_pylist(), members, strict=True):
            # null metadata stays as None: `score is not None` must see the key
            sample: dict[str, Any] = {
                k: v for k, v in row.items() if v is not None or k not in ("split", "label")
            }
            for m in ms:
                ext = m["ext"]
                if ext.rpartition(".")[2].lower() in IMAGE_EXTENSIONS and "image" not in sample:
                    sample["image"], sample["image_ext"] = reader.read(m), ext
                else:
                    sample[f"member:{ext}"] = reader.read(m)
            out.append(sample)
    finally:
        reader.close()
    return out
