"""Rows for the Ray datasink's tests, made where they are needed: in Ray's workers
(``ray.data.range(n).map_batches(image_rows)``), so that their bytes never pass through
the driver, or in the test process for a direct export of the same samples."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from PIL import Image

from shardex.refs.scan import ScanResult, build_table
from shardex.sources.base import Source
from shardex.storage.object import ObjectStorage

LABELS = ("cat", "dog", "fox")


def jpeg(seed: int, side: int) -> bytes:
    """A ``side`` x ``side`` JPEG of noise (noise does not compress: about side**2 bytes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def image_rows(batch: dict[str, np.ndarray], side: int = 64) -> pa.Table:
    """Ray rows for the sample numbers in ``batch["id"]``: key, jpg, split, label, score
    (split before label, as a scan table has them: metadata.parquet keeps the order)."""
    ids = [int(i) for i in batch["id"]]
    return pa.table(
        {
            "key": [f"s/{i:05d}" for i in ids],
            "jpg": pa.array([jpeg(i, side) for i in ids], pa.binary()),
            "split": ["val" if i % 5 == 0 else "train" for i in ids],
            "label": pa.array([i % 3 for i in ids], pa.int64()),
            "score": pa.array(np.asarray(ids, np.float32) / 7),
        }
    )


class RowsSource(Source):
    """The same samples as :func:`image_rows`, as a source of :func:`shardex.export`."""

    kind: ClassVar[str] = "rows"

    def __init__(self, rows: pa.Table) -> None:
        self.rows, self.uri = rows, "rows"

    def scan(self) -> ScanResult:
        rows = self.rows
        keys = rows.column("key").to_pylist()
        members = [
            [{"ext": "jpg", "path": None, "offset": -1, "size": len(b), "data": b}]
            for b in rows.column("jpg").to_pylist()
        ]
        table = build_table(
            keys,
            keys,
            members,
            splits=rows.column("split").to_pylist(),
            labels=rows.column("label").to_pylist(),
            metadata=rows.select(["score"]),
        )
        return ScanResult(table, LABELS)


def local_rows(n: int, side: int = 64) -> pa.Table:
    """:func:`image_rows` of samples ``0 .. n-1``, made here."""
    return image_rows({"id": np.arange(n)}, side)


def first_half_slow(batch: dict[str, np.ndarray], half: int) -> dict[str, np.ndarray]:
    """A step whose blocks of the first ``half`` samples finish last (Ray passes blocks
    on in completion order unless ``preserve_order`` is set)."""
    import time

    if int(str(batch["key"][0]).rpartition("/")[2]) < half:  # keys s/NNNNN
        time.sleep(0.5)
    return batch


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a raylet started it)."""
    try:
        return Path(f"/proc/{os.getppid()}/comm").read_text().strip() == "raylet"
    except OSError:
        return False


class ByProcess(ObjectStorage):
    """An S3 storage whose requests go to the server directly in Ray's workers and
    through the counting proxy everywhere else (the driver, and any process it starts
    itself, such as a local worker pool): the proxy sees exactly the driver's share.
    It decides again wherever it is unpickled."""

    def __init__(self, url: str, counted: dict[str, Any], direct: dict[str, Any]) -> None:
        super().__init__(url, direct if in_ray_worker() else counted)
        self._choices = (counted, direct)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ByProcess, (self.uri, *self._choices))


__all__ = [
    "LABELS",
    "ByProcess",
    "RowsSource",
    "first_half_slow",
    "image_rows",
    "in_ray_worker",
    "jpeg",
    "local_rows",
]
