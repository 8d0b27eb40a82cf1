"""Write a Ray Dataset as a shardex export: :class:`ShardexDatasink`, :func:`write_shardex`.

Each write task turns its blocks into scan-table rows (see :mod:`shardex.ray.rows`) and
stages them as two files: a Parquet file of keys, labels, metadata and member references,
and a data file holding the member bytes. When every task is done, the driver reads the
Parquet files in task order and calls :func:`shardex.export` once, which reads the bytes by
offset while it writes the shards, plans shards across all tasks (only the last shard of a
split may be short) and commits ``config.yaml`` last. The staging folder is removed
afterwards, whether the export succeeded or not.

The driver must be able to read what the tasks staged: a local cluster, or a staging
folder on a file system every node shares (``temp_dir=``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
from ray.data import Dataset as RayDataset
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor
from ray.data.datasource.datasink import WriteResult

from shardex.contract import ExportConfig
from shardex.errors import EmptySourceError, ExportError
from shardex.options import ExportOptions
from shardex.ray.rows import scan_rows
from shardex.sources.base import ScanResult, Source
from shardex.storage import Storage, open_storage

if TYPE_CHECKING:
    from ray.data._internal.execution.interfaces import TaskContext


@dataclass(frozen=True, slots=True)
class StagedPart:
    """What one write task staged: its task number, its Parquet file and row count."""

    task: int
    rows: str
    num_rows: int


class _StagedRows(Source):
    """The rows the write tasks staged, in task order, as a source for the exporter."""

    kind: ClassVar[str] = "ray"

    def __init__(self, table: pa.Table, label_names: tuple[str, ...] | None) -> None:
        self.table, self.label_names = table, label_names
        self.uri = "ray.data.Dataset"

    def scan(self) -> ScanResult:
        return ScanResult(self.table, self.label_names)


class ShardexDatasink(Datasink[StagedPart | None]):
    """A Ray Data sink that writes a shardex export (``ds.write_datasink(sink)``).

    Rows follow the conventions of :mod:`shardex.ray.rows`: a ``key`` (or ``__key__``),
    encoded bytes in binary columns named like WebDataset fields (``jpg``, ``x.npy``) or in
    ``image`` + ``image_ext``, and typed metadata, ``label`` and ``split`` columns. The
    export equals what :func:`shardex.export` writes from the same rows in the same order
    (shards, index and Parquet files byte for byte). Use :func:`write_shardex`, which keeps
    the dataset's order; with ``write_datasink`` directly, set
    ``ds.context.execution_options.preserve_order = True`` for a deterministic export.

    Args:
        output: the export's folder or URL (or a Storage).
        label_names: class names of the ``label`` numbers, recorded in config.yaml.
        storage_options: options for object storage (see docs/storage.md).
        temp_dir: where write tasks stage their rows and bytes; it must be readable by the
            driver (a shared file system on a multi-node cluster). Default: beside a local
            output (same file system), else the system's temporary folder.
        progress: show the export's progress bars on the driver.
        **export_options: fields of :class:`shardex.ExportOptions` (``samples_per_shard``
            or NeMo's ``images_per_tar``, ``backend``, ``split_fractions``, ``mode`` ...).
    """

    def __init__(
        self,
        output: str | os.PathLike[str] | Storage,
        *,
        label_names: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        temp_dir: str | os.PathLike[str] | None = None,
        progress: bool = False,
        **export_options: Any,
    ) -> None:
        if "images_per_tar" in export_options:
            export_options["samples_per_shard"] = export_options.pop("images_per_tar")
        self.options = ExportOptions(**export_options)  # bad options fail before any task
        self.output = output
        self.label_names = tuple(label_names) if label_names is not None else None
        self.storage_options = storage_options
        self.progress = progress
        self.staging = _staging_dir(output, storage_options, temp_dir)
        #: The committed contract, once the write is complete.
        self.result: ExportConfig | None = None

    def get_name(self) -> str:
        return "Shardex"

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """Create the staging folder (on the driver, before any write task runs)."""
        del schema  # the schema before a fused map step: not the rows the tasks will see
        Path(self.staging).mkdir(parents=True, exist_ok=True)

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> StagedPart | None:
        """Stage this task's rows: ``task-NNNNNN.parquet`` and its ``.bin`` data file."""
        folder = Path(self.staging)
        if not folder.is_dir():  # removed after a failure, or not shared with this node
            raise ExportError(
                f"ShardexDatasink: the staging folder {folder} does not exist on this node; "
                "the driver must read what the tasks stage: pass temp_dir= on a file "
                "system every node mounts"
            )
        name = f"task-{ctx.task_idx:06d}"
        data_path, rows_path = folder / f"{name}.bin", folder / f"{name}.parquet"
        # a retried task rewrites its files: write under temporary names, then rename
        data_tmp, rows_tmp = data_path.with_suffix(".bin.tmp"), rows_path.with_suffix(".tmp")
        where = f"ShardexDatasink (write task {ctx.task_idx})"
        tables = []
        with open(data_tmp, "wb") as data:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows:
                    tables.append(scan_rows(table, data, str(data_path), where))
        if not tables:
            data_tmp.unlink()
            return None
        rows = pa.concat_tables(tables, promote_options="default")
        pq.write_table(rows, rows_tmp)
        os.replace(data_tmp, data_path)
        os.replace(rows_tmp, rows_path)
        return StagedPart(ctx.task_idx, str(rows_path), rows.num_rows)

    def on_write_complete(self, write_result: WriteResult[StagedPart | None]) -> None:
        """Export the staged rows in task order (config.yaml commits last), then remove
        the staging folder."""
        from shardex.exporter import export

        try:
            parts = sorted((p for p in write_result.write_returns if p), key=lambda p: p.task)
            if not parts:
                raise EmptySourceError("the Ray Dataset has no rows; nothing to export")
            table = pa.concat_tables(
                [pq.read_table(p.rows) for p in parts], promote_options="default"
            )
            self.result = export(
                _StagedRows(table, self.label_names),
                self.output,
                self.options,
                storage_options=self.storage_options,
                progress=self.progress,
            )
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)

    def on_write_failed(self, error: Exception) -> None:
        """Remove the staging folder (no config.yaml was written)."""
        del error
        shutil.rmtree(self.staging, ignore_errors=True)


def write_shardex(
    dataset: RayDataset,
    output: str | os.PathLike[str] | Storage,
    **options: Any,
) -> ExportConfig:
    """Write a Ray Dataset as a shardex export, in the dataset's order.

    Args:
        dataset: rows as :class:`ShardexDatasink` describes them.
        output: the export's folder or URL (or a Storage).
        **options: :class:`ShardexDatasink`'s keyword arguments and export options
            (``samples_per_shard=1000``, ``backend="webdataset"``, ``label_names=...``,
            ``mode="overwrite"`` ...).

    Returns:
        The committed contract (config.yaml).

    Raises:
        SourceError: rows without a key or without encoded data (raised by the write task,
            wrapped by Ray as a ``RayTaskError`` that is also a SourceError).
        OutputExistsError: the output holds an export and ``mode`` does not replace it.
    """
    sink = ShardexDatasink(output, **options)
    execution = dataset.context.execution_options
    saved = execution.preserve_order
    # tasks are numbered in the order their input arrives; in order only when preserved
    execution.preserve_order = True
    try:
        dataset.write_datasink(sink)
    finally:
        execution.preserve_order = saved
    assert sink.result is not None  # on_write_complete ran, or write_datasink raised
    return sink.result


def _staging_dir(
    output: str | os.PathLike[str] | Storage,
    storage_options: dict[str, Any] | None,
    temp_dir: str | os.PathLike[str] | None,
) -> str:
    """An absolute, new folder name. Not inside the output: the exporter refuses files it
    did not write there, and deletes its own temporary files before it starts."""
    token = secrets.token_hex(6)
    if temp_dir is not None:
        return str(Path(temp_dir).expanduser().absolute() / f"shardex-ray-{token}")
    root = open_storage(output, storage_options).local_path("")
    if root is not None:
        root = root.absolute()
        return str(root.parent / f".{root.name}.shardex-ray-{token}")
    return str(Path(tempfile.gettempdir()) / f"shardex-ray-{token}")
