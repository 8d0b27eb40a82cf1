"""The end of an export: errors.parquet, metadata.parquet (streamed as shards
complete), the contract, the commit point (config.yaml) and the clean-up after it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from shardex.backends.base import Backend, unused_name
from shardex.backends.ownership import export_owns
from shardex.backends.registry import REGISTRY
from shardex.contract import (
    CONFIG_FILE,
    ERRORS_FILE,
    FORMAT_VERSION,
    METADATA_FILE,
    ExportConfig,
    SourceInfo,
    SplitInfo,
)
from shardex.engine.prepare import Prepared
from shardex.errors import ExportError, UnverifiedOutputError, mode_hint
from shardex.format.tables import PARQUET_WRITE, ParquetFile, read_checked_table
from shardex.options import ExportOptions
from shardex.planning import key_specs
from shardex.quoting import quoted
from shardex.refs.members import JSON_COLUMN
from shardex.sources import Source
from shardex.storage import Storage
from shardex.storage.local import temporary_target
from shardex.version import __version__


def export_files(config: ExportConfig) -> list[str]:
    """Every file of an export but config.yaml (a folder shard by its folder), derived too."""
    files = [f for f in (config.metadata_file, config.errors_file) if f]
    for info in config.splits.values():
        files += [p for s in info.shards for p in (s.path, s.metadata, s.dali_index) if p]
        if info.index is not None:
            files += [info.index.samples, info.index.keys]
            files += [info.index.members] if info.index.members else []
        files += info.files
    return list(dict.fromkeys([*files, *derived_files(config)]))


def write_errors(
    storage: Storage,
    skipped: list[dict[str, str]],
    previous: ExportConfig | None = None,
    taken: frozenset[str] = frozenset(),
) -> tuple[str | None, str | None]:
    """errors.parquet (an append's earlier rows first): its name and checksum."""
    if previous is not None and previous.errors_file:
        old = read_checked_table(storage, previous.errors_file, previous.errors_checksum)
        skipped = old.to_pylist() + skipped
    if not skipped:
        return None, None
    table = pa.Table.from_pylist(
        skipped,
        schema=pa.schema(
            [("key", pa.string()), ("original_path", pa.string()), ("reason", pa.string())]
        ),
    )
    name = unused_name(ERRORS_FILE, taken)
    with storage.open_writer(name) as out:
        pq.write_table(table, sink := ParquetFile(out))
    return name, sink.checksum


def combined_digest(digests: list[str]) -> str:
    return str(xxhash.xxh3_128("\n".join(digests).encode()).hexdigest())


class MetadataSink:
    """Streams shard rows into metadata.parquet as shards complete."""

    def __init__(self, storage: Storage, name: str = METADATA_FILE) -> None:
        self._out = storage.open_writer(name)
        self._file = ParquetFile(self._out)
        self._writer: pq.ParquetWriter | None = None
        self.num_rows = 0
        self.checksum: str | None = None

    def __call__(self, table: pa.Table) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._file, table.schema, **PARQUET_WRITE)
        try:
            self._writer.write_table(table)
        except ValueError as exc:  # pyarrow: the schema differs from the rows before
            raise ExportError(f"the new samples' columns differ from the export's: {exc}") from exc
        self.num_rows += table.num_rows

    def commit(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._out.commit()
        self.checksum = self._file.checksum

    def abort(self) -> None:
        if self._writer is not None:  # closed here, or its finaliser writes to a dead file
            with contextlib.suppress(Exception):
                self._writer.close()
        self._out.abort()


def contract(
    prep: Prepared,
    src: Source,
    opts: ExportOptions,
    backend: Backend,
    written: dict[str, SplitInfo],
    fingerprint: str,
    errors_file: str | None,
    previous: ExportConfig | None = None,
    num_skipped: int = 0,
) -> ExportConfig:
    """The config.yaml of what was written."""
    num_classes = None
    if prep.with_label:
        top = prep.label_max
        num_classes = (
            len(prep.label_names) if prep.label_names else (None if top is None else top + 1)
        )
    columns = pa.schema(f for f in prep.schema if f.name not in ("export_index", JSON_COLUMN))
    specs = key_specs(
        columns, prep.stored, prep.fields, prep.x_keys, prep.y_keys, backend, prep.image_formats
    )
    fractions = prep.split_method == "fractions"
    return ExportConfig(
        format_version=previous.format_version if previous else FORMAT_VERSION,
        backend=backend.name,
        num_samples=sum(s.num_samples for s in written.values()),
        splits=written,
        key_specs=specs,
        x_keys=prep.x_keys,
        y_keys=prep.y_keys,
        writer={"name": "shardex", "version": __version__},
        shardex_version=__version__,
        label_names=prep.label_names,
        num_classes=num_classes,
        feature_shapes={
            s.key: list(s.shape) for s in specs if s.key in prep.x_keys and s.shape is not None
        },
        source_datasets=(
            *(previous.source_datasets if previous else ()),
            SourceInfo(src.uri, src.kind, prep.num_rows + len(prep.skipped), fingerprint),
        ),
        source_fingerprint=(
            combined_digest([previous.source_fingerprint, fingerprint]) if previous else fingerprint
        ),
        split_seed=opts.seed if fractions else None,
        split_fractions=dict(opts.split_fractions or {}) if fractions else None,
        split_method=prep.split_method,
        shard_options=_shard_options(opts),
        errors_file=errors_file,
        num_skipped=num_skipped + (previous.num_skipped if previous else 0),
        extra=dict(opts.extra),
        fields=prep.fields,
    )


def _shard_options(opts: ExportOptions) -> dict[str, Any]:
    """config.yaml's ``shard_options`` (defaults left out)."""
    return {
        "samples_per_shard": opts.samples_per_shard,
        "max_shard_bytes": opts.max_shard_bytes,
        "naming": "deterministic" if opts.deterministic_name else "random",
        "validate": opts.validate,
        "on_error": opts.on_error,
        **({"dtype": opts.dtype} if opts.dtype else {}),
        **({"image_member": opts.image_member} if opts.image_member else {}),
        **({"layout": opts.layout} if opts.layout != "split" else {}),
        **({"backend_options": dict(opts.backend_options)} if opts.backend_options else {}),
    }


def derived_files(config: ExportConfig) -> dict[str, bytes]:
    """The files that follow from config.yaml alone (shard lists)."""
    backend = REGISTRY.backend_class(config.backend)
    return {
        p: data
        for split in config.splits
        for p, data in backend.derived_files(config, split).items()
    }


def write_derived(storage: Storage, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        storage.put(path, data)
    storage.sync(list(files))


def commit(storage: Storage, config: ExportConfig) -> None:
    """Check and sync every file, then put config.yaml: the commit point.

    New derived files (shard lists) go before it; those of a replaced export just after,
    as until the commit they describe the committed one (:func:`remove_stale` follows).
    """
    derived = derived_files(config)
    # every shard job is done: a temporary file left now is a killed attempt's
    remove_leftovers(storage, config)
    check_written(storage, config, derived)
    later = {p: data for p, data in derived.items() if storage.exists(p)}
    write_derived(storage, {p: data for p, data in derived.items() if p not in later})
    storage.sync(export_files(config))
    storage.put(CONFIG_FILE, config.to_yaml().encode())
    storage.sync([CONFIG_FILE])
    write_derived(storage, later)


def check_written(storage: Storage, config: ExportConfig, derived: dict[str, bytes]) -> None:
    """Refuse to commit unless every file config.yaml names is listed, each shard the size
    its writer reported: one listing, no byte read, catches a shard lost or cut short
    (a retry racing a dead task, a store that dropped it) before it is committed."""
    sizes = {name: size for page in storage.list_pages() for name, size in page}
    folders = {name[:i] for name in sizes for i, c in enumerate(name) if c == "/"}
    shards = {s.path: s.num_bytes for info in config.splits.values() for s in info.shards}
    problems: list[str] = []
    for path in export_files(config):
        if path in derived:
            continue
        if path not in sizes and path not in folders:  # a shard may be a folder (numpy)
            problems.append(f"{quoted(path)} is missing")
        elif path in sizes and path in shards and sizes[path] != shards[path]:
            problems.append(
                f"{quoted(path)} is {sizes[path]} bytes, its writer reported {shards[path]}"
            )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UnverifiedOutputError(
            f"{storage.uri}: {problems[0]}{more} after the shards were written; nothing was "
            "committed. Something changed the output meanwhile (another process, or the "
            f"store lost it): run the export again with {mode_hint('resume')}"
        )


def remove_leftovers(storage: Storage, config: ExportConfig) -> None:
    """Delete killed attempts' temporary files at this export's names (only its own)."""
    for path in storage.leftovers():
        target = temporary_target(path)
        if target is not None and export_owns(config, target):
            storage.delete(path)


def old_metadata(storage: Storage, previous: ExportConfig | None) -> pa.Table | None:
    if previous is None or not previous.metadata_file:
        return None
    return read_checked_table(storage, previous.metadata_file, previous.metadata_checksum)
