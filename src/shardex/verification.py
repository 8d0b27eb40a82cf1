"""``shardex verify``: check an export against its contract, byte for byte.

Checks, in order: config.yaml against its schema; every split, as its backend says
(:meth:`Backend.verify_split <shardex.backends.Backend.verify_split>`: index files, every
shard and sample against its checksums, sidecars; the ``webdataset`` backend's in
:mod:`shardex.backends.webdataset.verify`, the array backends' in
:mod:`shardex.verify_arrays`); metadata.parquet and errors.parquet (whole-file checksums
where recorded, row counts); with ``deep``, that every image decodes. Problems are
collected, not raised: the report lists each with the file and, where known, the sample key.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from shardex.backends.base import Check
from shardex.backends.registry import backend_for
from shardex.contract import CONFIG_FILE
from shardex.errors import ShardexError
from shardex.format.tables import arrow_reader
from shardex.progress import Progress
from shardex.storage import Storage, open_storage


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an export."""

    file: str
    kind: str
    message: str
    key: str | None = None

    def __str__(self) -> str:
        where = f"{self.file} [{self.key}]" if self.key else self.file
        return f"{where}: {self.kind}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """What verify found; ``ok`` when nothing is wrong."""

    uri: str
    problems: list[Problem] = field(default_factory=list)
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    deep: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, file: str, kind: str, message: str, key: str | None = None) -> None:
        """Record a problem."""
        self.problems.append(Problem(file, kind, message, key))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (``shardex verify --json``)."""
        out = {k: v for k, v in asdict(self).items() if k != "problems"}
        return {**out, "ok": self.ok, "problems": [asdict(p) for p in self.problems]}


def verify(
    location: str | Storage,
    *,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> VerifyReport:
    """Check an export; see the module docstring for what is checked."""
    from shardex.api import read_config

    storage = open_storage(location, storage_options)
    report = VerifyReport(storage.uri, deep=deep)
    try:
        config = read_config(storage)
    except ShardexError as exc:
        report.problems.append(Problem(CONFIG_FILE, "config", str(exc)))
        return report
    with Progress(progress) as bars:
        bar = bars.task("verifying samples", config.num_samples)
        try:
            backend = backend_for(config)
        except ShardexError as exc:  # not installed, or unknown: its files cannot be read
            report.problems.append(Problem(CONFIG_FILE, "backend", str(exc)))
            return report
        for name in config.splits:
            backend.verify_split(storage, config, name, Check(report, deep, bar))
    _verify_table_file(
        storage,
        config.metadata_file,
        "metadata",
        config.metadata_checksum,
        config.num_samples,
        "samples",
        report,
    )
    _verify_table_file(
        storage,
        config.errors_file,
        "errors",
        config.errors_checksum,
        config.num_skipped,
        "samples were skipped",
        report,
    )
    return report


def load_npy(storage: Storage, path: str, report: VerifyReport) -> np.ndarray | None:
    try:
        return np.load(io.BytesIO(storage.get(path)), allow_pickle=False)  # type: ignore[no-any-return]
    except (ShardexError, ValueError, OSError) as exc:
        report.problems.append(Problem(path, "index", f"cannot be read: {exc}"))
        return None


def verify_key_table(
    storage: Storage, path: str, n: int, report: VerifyReport
) -> np.ndarray | None:
    """The key table: uint64 (2, n), hashes sorted, sample numbers a permutation. Returns
    the table when it has that shape and order (for the entries' hashes to be checked)."""
    keys = load_npy(storage, path, report)
    if keys is None:
        return None
    if keys.dtype != np.uint64 or keys.shape != (2, n):
        report.problems.append(
            Problem(path, "index", f"expected uint64 (2, {n}), found {keys.dtype} {keys.shape}")
        )
        return None
    if n and np.any(keys[0][1:] < keys[0][:-1]):
        report.problems.append(
            Problem(path, "index", "key hashes are not sorted: lookups by key would miss")
        )
        return None
    if n and not np.array_equal(np.sort(keys[1]), np.arange(n, dtype=np.uint64)):
        report.problems.append(
            Problem(path, "index", "the key table's sample numbers do not cover every sample")
        )
        return None
    return keys


def check_file_checksum(
    path: str, kind: str, data: bytes, expected: str | None, report: VerifyReport
) -> None:
    """A whole file against the checksum config.yaml records (exports written before
    shardex recorded one have None: nothing to compare)."""
    if expected is None:
        return
    found = f"xxh3_64:{xxhash.xxh3_64_hexdigest(data)}"
    if found != expected:
        report.problems.append(
            Problem(
                path, kind, f"whole-file checksum {found} differs from config.yaml's {expected}"
            )
        )


def _verify_table_file(
    storage: Storage,
    path: str | None,
    kind: str,
    checksum: str | None,
    rows_expected: int,
    what: str,
    report: VerifyReport,
) -> None:
    """A whole Parquet file of the export (metadata or errors): readable, its checksum,
    and ``rows_expected`` rows (``what`` says in config.yaml's words what they count)."""
    if not path:
        return
    try:
        data = storage.get(path)
        rows = pq.read_metadata(arrow_reader(data)).num_rows
    except (ShardexError, pa.ArrowException, OSError) as exc:
        report.problems.append(Problem(path, kind, f"cannot be read: {exc}"))
        return
    check_file_checksum(path, kind, data, checksum, report)
    if rows != rows_expected:
        report.problems.append(
            Problem(path, kind, f"has {rows} rows, config.yaml says {rows_expected} {what}")
        )
