"""Read a split of a shardex export as a Ray Dataset: :func:`read_shardex`.

Each read task reads a contiguous run of whole shards (sequential reads), its metadata
from their sidecars or ``metadata.parquet``; rows come in sample order.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray.data
from ray.data import Datasource, ReadTask
from ray.data.block import BlockAccessor, BlockMetadata

import ray
from shardex.api import open_dataset, read_config, resolve_split
from shardex.contract import METADATA_FILE, ExportConfig, ShardInfo
from shardex.dataset import Dataset
from shardex.errors import ConfigError, FormatError
from shardex.format.tables import arrow_reader, check_local_file, checked_file
from shardex.storage import Storage, open_storage

if TYPE_CHECKING:
    from ray.data.context import DataContext

KEY: Final = "__key__"
_BLOCK_BYTES: Final = 128 << 20  # Ray's own default
#: A guess of a metadata row's in-memory size, for Ray's planning when no field is read.
_METADATA_ROW_BYTES: Final = 256


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every read task needs, put in Ray's object store once."""

    storage: Storage
    config: ExportConfig
    split: str
    dataset: Dataset | None  # None when no sample field is read: metadata only
    columns: tuple[str, ...]
    fields: tuple[str, ...]
    metadata: tuple[str, ...]
    decode: bool


class ShardexDatasource(Datasource):
    """One split of a shardex export, any backend, as a Ray Data datasource.

    Args:
        uri: the export's folder or URL (or a Storage).
        split: which split (None: the only one).
        decode: decode fields as :func:`shardex.open_dataset` does; default: stored bytes.
        columns: the columns to return, in this order; naming no field reads no shard.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str] | Storage,
        *,
        split: str | None = "train",
        decode: bool = False,
        columns: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        storage = open_storage(uri, storage_options)
        config = read_config(storage)
        split = resolve_split(config, split, storage.uri)
        info = config.split(split)
        fields = tuple(f.name for f in config.fields)
        meta_schema = _metadata_schema(storage, config, info.shards)
        meta = tuple(n for n in meta_schema.names if n != "key")  # the key is ``__key__``
        available = (KEY, *fields, *meta)
        chosen = tuple(columns) if columns is not None else available
        unknown = [c for c in chosen if c not in available]
        if unknown or len(set(chosen)) != len(chosen):
            raise ConfigError(
                f"read_shardex: columns {unknown or list(chosen)} are unknown or repeated; "
                f"{storage.uri} split {split!r} has {list(available)}"
            )
        read_fields = tuple(c for c in chosen if c in fields)
        dataset = open_dataset(storage, split, decode=decode) if read_fields else None
        metadata = tuple(c for c in chosen if c in meta)
        self._plan = _Plan(storage, config, split, dataset, chosen, read_fields, metadata, decode)
        # decoded fields: Ray picks their Arrow types (tensors) when it builds the blocks
        self._schema = None if decode and read_fields else _schema(chosen, fields, meta_schema)

    def get_name(self) -> str:
        return "Shardex"

    def estimate_inmemory_data_size(self) -> int:
        shards = self._plan.config.split(self._plan.split).shards
        return sum(self._size(s) for s in shards)

    def _size(self, shard: ShardInfo) -> int:
        if self._plan.fields:
            return shard.num_bytes
        return shard.num_samples * _METADATA_ROW_BYTES

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: DataContext | None = None,
    ) -> list[ReadTask]:
        """Contiguous runs of whole shards, at most ``parallelism`` of them."""
        shards = self._plan.config.split(self._plan.split).shards
        if not shards:
            return []
        starts = np.concatenate([[0], np.cumsum([s.num_samples for s in shards])])
        target = getattr(data_context, "target_max_block_size", None) or _BLOCK_BYTES
        # one copy in the object store, not one per task (MBs of contract at 10k shards)
        plan = ray.put(self._plan)
        tasks = []
        for group in np.array_split(np.arange(len(shards)), max(1, min(parallelism, len(shards)))):
            first, last = int(group[0]), int(group[-1]) + 1
            start, stop = int(starts[first]), int(starts[last])
            size = sum(self._size(s) for s in shards[first:last])
            rows_per_block = max(1, int(target * (stop - start) // max(size, 1)))
            read = functools.partial(
                _read_run, plan, shards[first:last], start, stop, rows_per_block
            )
            tasks.append(
                ReadTask(
                    functools.update_wrapper(read, _read_run),  # Ray's messages use __name__
                    BlockMetadata(
                        num_rows=stop - start,
                        size_bytes=size,
                        exec_stats=None,
                        input_files=tuple(s.path for s in shards[first:last]),
                    ),
                    schema=self._schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def read_shardex(
    uri: str | os.PathLike[str] | Storage,
    *,
    split: str | None = "train",
    decode: bool = False,
    columns: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    parallelism: int = -1,
    preserve_order: bool = True,
) -> ray.data.Dataset:
    """A split of a shardex export as a Ray Dataset, one row per sample, in sample order.

    Rows hold ``__key__``, the stored fields (exact bytes, null where absent) and the
    metadata columns with their Arrow types.

    Args:
        uri, split, decode, columns, storage_options: as :class:`ShardexDatasource`.
        parallelism: the number of read tasks (at most one per shard); -1 lets Ray choose.
        preserve_order: keep sample order through every later step; False lets blocks
            pass as tasks finish (Ray's default: more throughput).

    Returns:
        A lazy ``ray.data.Dataset``; ``ds.iter_rows()`` gives the samples in order.
    """
    source = ShardexDatasource(
        uri, split=split, decode=decode, columns=columns, storage_options=storage_options
    )
    dataset: ray.data.Dataset = ray.data.read_datasource(
        source, override_num_blocks=parallelism if parallelism > 0 else None
    )
    # this dataset (and those made from it) has a context of its own: the setting stays
    dataset.context.execution_options.preserve_order = preserve_order
    return dataset


def _read_run(
    plan_ref: ray.ObjectRef[_Plan],
    shards: Sequence[ShardInfo],
    start: int,
    stop: int,
    rows_per_block: int,
) -> Iterator[pa.Table]:
    """Samples ``start`` to ``stop`` of the split (whole shards), block by block."""
    plan: _Plan = ray.get(plan_ref)
    meta = _metadata_rows(plan, shards, start, stop)
    keys = meta.column("key")
    for at in range(start, stop, rows_per_block):
        end = min(at + rows_per_block, stop)
        rows = meta.slice(at - start, end - at)
        columns: dict[str, Any] = {KEY: keys.slice(at - start, end - at)}
        columns.update({name: rows.column(name) for name in plan.metadata})
        if plan.dataset is not None:
            samples = plan.dataset.get_many(range(at, end))
            found = [s[KEY] for s in samples]
            if found != columns[KEY].to_pylist():
                raise FormatError(
                    f"{plan.storage.uri} split {plan.split!r}: samples {at}-{end} do not "
                    "match their metadata rows (a damaged export; run shardex verify)"
                )
            columns.update(_field_columns(samples, plan.fields, plan.decode))
        yield pa.table({name: columns[name] for name in plan.columns})


def _field_columns(
    samples: list[dict[str, Any]], fields: tuple[str, ...], decode: bool
) -> dict[str, Any]:
    if not decode:
        return {f: pa.array([s.get(f) for s in samples], pa.binary()) for f in fields}
    batch = {}
    for f in fields:  # object arrays: Ray chooses the Arrow type (tensors for images)
        values = np.empty(len(samples), dtype=object)
        values[:] = [s.get(f) for s in samples]
        batch[f] = values
    block = BlockAccessor.batch_to_block(batch)
    table = BlockAccessor.for_block(block).to_arrow()
    return {f: table.column(f) for f in fields}


def _metadata_rows(plan: _Plan, shards: Sequence[ShardInfo], start: int, stop: int) -> pa.Table:
    """The metadata rows of samples ``start`` to ``stop``, from sidecars or metadata.parquet."""
    columns = ["key", *plan.metadata]
    if all(s.metadata for s in shards):
        rows = pa.concat_tables(
            _parquet(plan.storage, str(s.metadata), columns, checksum=s.metadata_checksum)
            for s in shards
        )
    else:
        name = plan.config.metadata_file or METADATA_FILE
        where = [
            ("split", "=", plan.split),
            ("sample_index", ">=", start),
            ("sample_index", "<", stop),
        ]
        wanted = list(dict.fromkeys([*columns, "sample_index"]))
        rows = _parquet(plan.storage, name, wanted, where)
        rows = rows.sort_by("sample_index").select(columns)
    if rows.num_rows != stop - start:
        raise FormatError(
            f"{plan.storage.uri} split {plan.split!r}: samples {start}-{stop} have "
            f"{rows.num_rows} metadata rows (a damaged export; run shardex verify)"
        )
    return rows


def _parquet(
    storage: Storage,
    path: str,
    columns: list[str],
    filters: list[Any] | None = None,
    *,
    checksum: str | None = None,
) -> pa.Table:
    """Some rows of a Parquet file of the export, checked against ``checksum`` if given."""
    local = storage.local_path(path)
    if local is not None:
        check_local_file(local, checksum, storage.join(path))
        src: Any = str(local)
    else:
        src = arrow_reader(checked_file(storage, path, checksum))
    return pq.read_table(src, columns=columns, filters=filters)


def _schema(columns: tuple[str, ...], fields: tuple[str, ...], metadata: pa.Schema) -> pa.Schema:
    """The rows' schema: the key, raw fields as bytes, metadata with its own types."""
    types = {KEY: pa.string(), **dict.fromkeys(fields, pa.binary())}
    return pa.schema([pa.field(c, types[c]) if c in types else metadata.field(c) for c in columns])


def _metadata_schema(
    storage: Storage, config: ExportConfig, shards: Sequence[ShardInfo]
) -> pa.Schema:
    """The split's metadata columns and types, from a sidecar when there is one (small)."""
    path = shards[0].metadata if shards and shards[0].metadata else None
    path = path or config.metadata_file or METADATA_FILE
    local = storage.local_path(path)
    src: Any = str(local) if local is not None else arrow_reader(storage.get(path))
    return pq.read_schema(src)
