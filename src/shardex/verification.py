"""``shardex verify``: check an export against its contract, byte for byte.

config.yaml, then every split as its backend says (``Backend.verify_split``), then
metadata.parquet and errors.parquet; with ``deep``, every image decodes. Problems are
collected, not raised, each with its file and, where known, its sample key.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from shardex.backends.base import Check
from shardex.backends.ownership import INTENT_FILE
from shardex.backends.registry import backend_for
from shardex.contract import CONFIG_FILE, ExportConfig
from shardex.errors import ShardexError
from shardex.format.tables import arrow_reader
from shardex.progress import Progress
from shardex.storage import Storage, open_storage
from shardex.verify_report import Problem, VerifyReport, verify_key_table

__all__ = ["Problem", "VerifyReport", "check_file_checksum", "verify", "verify_key_table"]


def verify(
    location: str | Storage,
    *,
    deep: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> VerifyReport:
    """Check an export; see the module docstring for what is checked."""
    storage = open_storage(location, storage_options)
    report = VerifyReport(storage.uri, deep=deep)
    try:
        config = ExportConfig.read(storage)
    except ShardexError as exc:
        report.add(CONFIG_FILE, "config", str(exc))
        return report
    with Progress(progress) as bars:
        bar = bars.task("verifying samples", config.num_samples)
        try:
            backend = backend_for(config)
        except ShardexError as exc:  # not installed, or unknown: its files cannot be read
            report.add(CONFIG_FILE, "backend", str(exc))
            return report
        for name in config.splits:
            backend.verify_split(storage, config, name, Check(report, deep, bar))
            _verify_derived(storage, backend.derived_files(config, name), report)
    tables = (
        (config.metadata_file, "metadata", config.metadata_checksum, config.num_samples, "samples"),
        (
            config.errors_file,
            "errors",
            config.errors_checksum,
            config.num_skipped,
            "samples were skipped",
        ),
    )
    for path, kind, checksum, rows, what in tables:
        _verify_table_file(storage, path, kind, checksum, rows, what, report)
    return report


def _verify_derived(storage: Storage, files: dict[str, bytes], report: VerifyReport) -> None:
    for path, want in files.items():
        try:
            found = storage.get(path)
        except ShardexError as exc:
            report.add(path, "missing", f"cannot be read ({exc})")
            continue
        # A writer at work or killed just after its commit (its intent file is there) has
        # not replaced the lists yet; they name the old tars, which are still there.
        if found != want and not storage.exists(INTENT_FILE):
            report.add(
                path,
                "list",
                "does not list the shards config.yaml names; export again with the "
                "same options (it rewrites it) or delete it and rerun the export",
            )


def check_file_checksum(
    path: str, kind: str, data: bytes, expected: str | None, report: VerifyReport
) -> None:
    """A whole file against the checksum config.yaml records, if any."""
    if expected is None:
        return
    found = f"xxh3_64:{xxhash.xxh3_64_hexdigest(data)}"
    if found != expected:
        report.add(path, kind, f"whole-file checksum {found} differs from config.yaml's {expected}")


def _verify_table_file(
    storage: Storage,
    path: str | None,
    kind: str,
    checksum: str | None,
    rows_expected: int,
    what: str,
    report: VerifyReport,
) -> None:
    """A Parquet file of the export: readable, its checksum, ``rows_expected`` rows."""
    if not path:
        return
    try:
        data = storage.get(path)
        rows = pq.read_metadata(arrow_reader(data)).num_rows
    except (ShardexError, pa.ArrowException, OSError) as exc:
        report.add(path, kind, f"cannot be read: {exc}")
        return
    check_file_checksum(path, kind, data, checksum, report)
    if rows != rows_expected:
        report.add(path, kind, f"has {rows} rows, config.yaml says {rows_expected} {what}")
