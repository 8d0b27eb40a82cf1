"""An existing shardex export as a source: splits, labels and metadata are kept."""

from __future__ import annotations

import os
from typing import ClassVar

import pyarrow as pa

from shardex.errors import SourceError
from shardex.sources.base import MEMBERS, RESERVED, ScanResult, Source, build_table
from shardex.sources.tars import _Collector, scan_tar
from shardex.storage import open_storage


class ExportSource(Source):
    """Samples of a committed export (local), every split, with their metadata."""

    kind: ClassVar[str] = "shardex-export"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.uri = os.fspath(root)

    def scan(self) -> ScanResult:
        from shardex.api import open_dataset, read_config

        storage = open_storage(self.uri)
        config = read_config(storage)
        keys: list[str] = []
        originals: list[str] = []
        splits: list[str] = []
        members = []
        metas = []
        for split in config.splits:
            ds = open_dataset(storage, split=split)
            out = _Collector()
            for shard in config.split(split).shards:
                local = storage.local_path(shard.path)
                if local is None:
                    raise SourceError(f"{self.uri}: only local exports can be re-exported yet")
                scan_tar(local, out, root=local.parent)
            meta = ds.metadata
            if meta.column("key").to_pylist() != out.keys:
                raise SourceError(f"{self.uri}: split {split!r}: shards and metadata disagree")
            keys += out.keys
            originals += meta.column("original_path").to_pylist()
            splits += [split] * len(out.keys)
            members += out.members
            metas.append(meta)
        meta = pa.concat_tables(metas)
        labels = meta.column("label").to_pylist() if "label" in meta.column_names else None
        user = meta.drop_columns([c for c in meta.column_names if c in RESERVED or c == MEMBERS])
        table = build_table(keys, originals, members, splits=splits, labels=labels, metadata=user)
        return ScanResult(table, config.label_names)
