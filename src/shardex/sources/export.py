"""An existing shardex export as a source: splits, labels, keys and metadata are kept.

A local ``webdataset`` export is re-read in place (members are byte ranges of its tars,
read only when the new shards are written); any other export, of any backend or on object
storage, is read through :func:`shardex.open_dataset`, its fields held in memory until
written.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import pyarrow as pa

from shardex.contract import ExportConfig
from shardex.errors import SourceError
from shardex.sources.base import MEMBERS, RESERVED, ScanResult, Source, build_table
from shardex.sources.tars import _Collector, scan_tar
from shardex.storage import Storage, open_storage


class ExportSource(Source):
    """Samples of a committed export, every split, with their metadata."""

    kind: ClassVar[str] = "shardex-export"

    def __init__(
        self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> None:
        self.uri = os.fspath(root)
        self.storage_options = storage_options

    def scan(self) -> ScanResult:
        from shardex.api import read_config

        storage = open_storage(self.uri, self.storage_options)
        config = read_config(storage)
        parts = [self._split(storage, config, split) for split in config.splits]
        keys = [k for p in parts for k in p[0]]
        members = [m for p in parts for m in p[1]]
        meta = pa.concat_tables([p[2] for p in parts])
        labels = meta.column("label").to_pylist() if "label" in meta.column_names else None
        user = meta.drop_columns([c for c in meta.column_names if c in RESERVED or c == MEMBERS])
        table = build_table(
            keys,
            meta.column("original_path").to_pylist(),
            members,
            splits=meta.column("split").to_pylist(),
            labels=labels,
            metadata=user,
        )
        return ScanResult(table, config.label_names)

    def _split(
        self, storage: Storage, config: ExportConfig, split: str
    ) -> tuple[list[str], list[list[dict[str, Any]]], pa.Table]:
        from shardex.api import open_dataset

        ds = open_dataset(storage, split=split)
        meta = ds.metadata
        local = [storage.local_path(s.path) for s in config.split(split).shards]
        if config.backend == "webdataset" and all(p is not None for p in local):
            out = _Collector()
            for path in local:
                assert path is not None
                scan_tar(path, out, root=path.parent)
            damaged = next((reason for reason in out.invalid if reason), None)
            if damaged is not None:  # a cut or damaged shard: its samples cannot be copied
                raise SourceError(f"{self.uri!r}: split {split!r}: {damaged}")
            keys, members = out.keys, out.members
        else:
            keys, members = [], []
            for sample in ds:
                keys.append(sample["__key__"])
                members.append(
                    [
                        {"ext": name, "path": None, "offset": -1, "size": len(v), "data": v}
                        for name, v in sample.items()
                        if name != "__key__"
                    ]
                )
        if meta.column("key").to_pylist() != keys:
            raise SourceError(f"{self.uri}: split {split!r}: shards and metadata disagree")
        # the label and the scalar-metadata JSON come back from metadata.parquet
        members = [[m for m in ms if m["ext"] not in ("cls", "json")] for ms in members]
        return keys, members, meta
