"""Write a Ray Dataset as a shardex export: :class:`ShardexDatasink`, :func:`write_shardex`.

No sample byte passes through the driver: write tasks stage rows and bytes in the output,
then the driver exports them in task order, under the lock it took first (docs/pipeline.md,
"Writing", walks through the steps).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

import pyarrow as pa
import pyarrow.parquet as pq
from ray.data import Dataset as RayDataset
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor
from ray.data.datasource.datasink import WriteResult

from shardex.contract import ExportConfig
from shardex.engine.output import check_output, check_root
from shardex.errors import (
    ConfigError,
    EmptySourceError,
    ExportError,
    ObjectNotFoundError,
    OutputExistsError,
)
from shardex.options import ExportOptions
from shardex.quoting import quoted
from shardex.ray.rows import scan_rows
from shardex.refs.scan import SampleStream, ScanBatch, batch_types_error
from shardex.sources.base import Source
from shardex.storage import Storage, open_storage
from shardex.storage.fetch.objects import register
from shardex.storage.lock import OutputLock, holder_text
from shardex.storage.staging import STAGED_PART, STAGED_ROWS, STAGING

if TYPE_CHECKING:
    from ray.data._internal.execution.interfaces import TaskContext

#: The source's name in config.yaml (``source_datasets``) and in messages.
SOURCE_URI: Final = "ray.data.Dataset"


@dataclass(frozen=True, slots=True)
class StagedPart:
    """What one write task staged: its rows' Parquet object (in the output) and schema."""

    task: int
    rows: str
    num_rows: int
    schema: pa.Schema


class _StagedRows(Source):
    """The staged rows, in task order, as a source (references only), in one schema."""

    kind: ClassVar[str] = "ray"

    def __init__(
        self, storage: Storage, parts: Sequence[StagedPart], label_names: tuple[str, ...] | None
    ) -> None:
        self.uri = SOURCE_URI
        self._storage, self._parts, self._label_names = storage, tuple(parts), label_names
        try:  # a column all null in one block and typed in another, ints widened to floats
            self._schema = pa.unify_schemas([p.schema for p in parts], promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise batch_types_error(self.uri, exc) from exc

    def stream(self) -> SampleStream:
        return SampleStream(self._batches(), self._label_names)

    def _batches(self) -> Iterator[ScanBatch]:
        for part in self._parts:
            table = _conform(self._read(part), self._schema)
            for start in range(0, table.num_rows, self.batch_size):
                yield ScanBatch(table.slice(start, self.batch_size))

    def _read(self, part: StagedPart) -> pa.Table:
        try:
            data = self._storage.get(part.rows)
        except ObjectNotFoundError as exc:
            raise ExportError(
                f"ShardexDatasink: the rows write task {part.task} staged "
                f"({quoted(self._storage.join(part.rows))}) are not there; a local output on "
                "a cluster of several machines must be on a file system that every node "
                "mounts at the same path (or use object storage: s3://...)"
            ) from exc
        return pq.read_table(pa.BufferReader(data))


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order (null where it lacks one)."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.table(columns, schema=schema)


class ShardexDatasink(Datasink[StagedPart | None]):
    """A Ray Data sink that writes a shardex export (``ds.write_datasink(sink)``).

    Rows follow :mod:`shardex.ray.rows`; the export equals :func:`shardex.export`'s of the
    same rows in the same order. Prefer :func:`write_shardex`, which keeps the order (else
    set ``preserve_order``). A local output on several machines must be mounted by all.

    Args:
        output: the export's folder or URL (or a Storage).
        label_names: class names of the ``label`` numbers, recorded in config.yaml.
        progress: show the export's progress bars on the driver.
        **export_options: fields of :class:`shardex.ExportOptions` (or ``images_per_tar``).
    """

    def __init__(
        self,
        output: str | os.PathLike[str] | Storage,
        *,
        label_names: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        progress: bool = False,
        **export_options: Any,
    ) -> None:
        if "temp_dir" in export_options:
            raise ConfigError(
                "ShardexDatasink: temp_dir= is gone: write tasks stage in the output itself "
                "(OUT/.shardex-staging/), so no staging folder needs to be shared; drop it"
            )
        if "images_per_tar" in export_options:
            export_options["samples_per_shard"] = export_options.pop("images_per_tar")
        self.options = ExportOptions(**export_options)  # bad options fail before any task
        self.storage = open_storage(output, storage_options)
        self.label_names = tuple(label_names) if label_names is not None else None
        self.progress = progress
        self.staging = f"{STAGING}{secrets.token_hex(6)}/"
        self.result: ExportConfig | None = None
        self._lock: OutputLock | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What write tasks get: not the driver's lock (a thread, or a file descriptor)."""
        return {**self.__dict__, "_lock": None}

    def get_name(self) -> str:
        return "Shardex"

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """Driver: take the output's lock, check the mode, remove what killed runs staged."""
        del schema  # the schema before a fused map step: not the rows the tasks will see
        check_root(self.storage)
        self._lock = self.storage.lock(holder_text("write_shardex"))
        try:
            if self.options.mode in ("error", "overwrite"):  # before any byte is staged
                check_output(self.storage, self.options.mode)
            _remove_killed_runs(self.storage)
        except BaseException:
            self._release()
            raise

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> StagedPart | None:
        """Stage this task's rows and bytes in the output's storage."""
        storage = self.storage
        name = f"{self.staging}task-{ctx.task_idx:06d}-{secrets.token_hex(4)}"
        data_name, rows_name = f"{name}.bin", f"{name}.parquet"
        where = f"ShardexDatasink (write task {ctx.task_idx})"
        location = _location(storage, data_name)
        tables = []
        with storage.open_writer(data_name) as data:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows:
                    tables.append(scan_rows(table, data, location, where))
        if not tables:
            storage.delete(data_name)
            return None
        try:
            rows = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise batch_types_error(SOURCE_URI, exc) from exc
        out = pa.BufferOutputStream()
        pq.write_table(rows, out)
        storage.put(rows_name, out.getvalue())  # after the bytes it names
        return StagedPart(ctx.task_idx, rows_name, rows.num_rows, rows.schema)

    def on_write_complete(self, write_result: WriteResult[StagedPart | None]) -> None:
        """Export the staged rows in task order, then remove this run's staging."""
        from shardex.engine.run import run_export
        from shardex.pipeline.ray_executor import RayExecutor

        try:
            parts = sorted((p for p in write_result.write_returns if p), key=lambda p: p.task)
            if not parts:
                raise EmptySourceError("the Ray Dataset has no rows; nothing to export")
            if self._lock is not None:
                self._lock.check()  # a lease lost while the tasks staged: export nothing
            if self.storage.local_path("") is None:
                register(self.storage)  # the tasks read the staged bytes with its options
            self.result = run_export(
                _StagedRows(self.storage, parts, self.label_names),
                self.storage,
                self.options,
                progress=self.progress,
                runner=RayExecutor().runner(),
                lock=self._lock,  # held until the commit: no gap for another writer
            )
        finally:
            self.close()

    def on_write_failed(self, error: Exception) -> None:
        """Remove this run's staging (no config.yaml was written)."""
        del error
        self.close()

    def close(self) -> None:
        """Remove this run's staging, then give the lock back if held (idempotent)."""
        try:
            _remove(self.storage, self.staging)
        finally:
            self._release()

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()


def write_shardex(
    dataset: RayDataset,
    output: str | os.PathLike[str] | Storage,
    **options: Any,
) -> ExportConfig:
    """Write a Ray Dataset as a shardex export, in the dataset's order.

    Args:
        dataset: rows as :class:`ShardexDatasink` describes them.
        output: the export's folder or URL (or a Storage).
        **options: :class:`ShardexDatasink`'s keyword arguments and export options.

    Raises:
        SourceError: rows without a key or encoded data (Ray's ``RayTaskError`` is one too).
        OutputExistsError: the output holds an export and ``mode`` does not replace it.
        OutputLockedError: another export is writing the output.
    """
    sink = ShardexDatasink(output, **options)
    execution = dataset.context.execution_options
    saved = execution.preserve_order
    # tasks are numbered as their input arrives: in the dataset's order only when preserved
    execution.preserve_order = True
    try:
        dataset.write_datasink(sink)
    finally:
        execution.preserve_order = saved
        sink.close()  # also when Ray called neither hook (an interrupt)
    assert sink.result is not None  # on_write_complete ran, or write_datasink raised
    return sink.result


def _location(storage: Storage, name: str) -> str:
    """How a staged member names its data object: an absolute local path, or a URL."""
    path = storage.local_path(name)
    return str(path.absolute()) if path is not None else storage.join(name)


def _remove_killed_runs(storage: Storage) -> None:
    """Delete what killed runs staged; refuse first if files no run staged are there."""
    found = [p for p in (*storage.list(STAGING), *storage.leftovers()) if p.startswith(STAGING)]
    foreign = [p for p in found if not (STAGED_ROWS.fullmatch(p) or STAGED_PART.fullmatch(p))]
    if foreign:
        raise OutputExistsError(
            f"output {storage.uri} holds {quoted(foreign[0])}"
            + (f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else "")
            + f", which write_shardex did not stage; {STAGING} is where write tasks stage "
            "their rows: move those files out of it, or write to another output"
        )
    for path in found:
        storage.delete(path)


def _remove(storage: Storage, prefix: str) -> None:
    """Delete everything under ``prefix``, killed writers' temporary files included."""
    folder = storage.local_path(prefix.rstrip("/"))
    if folder is None:
        for path in list(storage.list(prefix)):
            storage.delete(path)
        return
    shutil.rmtree(folder, ignore_errors=True)
    if prefix != STAGING:
        with contextlib.suppress(OSError):  # gone, or another run's staging is still there
            folder.parent.rmdir()
