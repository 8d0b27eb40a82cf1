"""``numpy``: ``S/samples-{hash}-NNNNNN/{sample}.{column}.npy``, one file per sample per
field (a folder per shard keeps folders small); see docs/backends.md."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import numpy as np

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.array_files import ArrayWriter, Written
from shardex.backends.arrays import ArrayBackend, shard_numbers
from shardex.backends.base import Capabilities
from shardex.backends.columns import KEY_COLUMN, ColumnReader, Columns, Layout, native_value
from shardex.contract import ExportConfig, ShardInfo, SplitInfo
from shardex.errors import ObjectNotFoundError
from shardex.format.tables import read_npy
from shardex.storage.base import Storage


class _SampleFiles(ColumnReader):
    """One shard folder: keys read at open, fields read on demand."""

    def __init__(self, layout: Layout, storage: Storage, folder: str) -> None:
        keys = {
            n: read_npy(storage, f"{folder}/{KEY_COLUMN}.{n}.npy", ".npy")
            for n in ("data", "offsets")
        }
        super().__init__(layout, {f"{KEY_COLUMN}.{n}": a for n, a in keys.items()})
        self.storage, self.folder = storage, folder
        self.first = 0  # sample i of this reader is sample first + i of the shard

    def shifted(self, first: int) -> _SampleFiles:
        out = copy.copy(self)
        out.first = first
        return out

    def key(self, i: int) -> str:
        return super().key(self.first + i)

    def native(self, i: int) -> dict[str, Any]:
        i += self.first
        out: dict[str, Any] = {}
        for spec in self.layout:
            try:
                value = read_npy(self.storage, f"{self.folder}/{i:06d}.{spec.column}.npy", ".npy")
            except ObjectNotFoundError:
                if spec.optional:
                    continue
                raise
            out[spec.name] = native_value(spec, value)
        return out


class NumpyDataset(ArrayDataset):
    def _load(self, shard: ShardInfo) -> Columns:
        raise NotImplementedError  # _open_run reads per sample instead

    def _open_run(self, shard: ShardInfo) -> ColumnReader:
        return _SampleFiles(self.layout, self.storage, shard.path)

    def _block(self, reader: ColumnReader, start: int, count: int) -> ColumnReader:
        assert isinstance(reader, _SampleFiles)
        return reader.shifted(start)  # per-sample files: nothing to read ahead


class NumpyBackend(ArrayBackend):
    name: ClassVar[str] = "numpy"
    description: ClassVar[str] = "one .npy file per sample per key"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True, streaming=True, remote=True
    )
    stem_name: ClassVar[str] = "samples"
    dataset: ClassVar[type[ArrayDataset]] = NumpyDataset

    @classmethod
    def reader_call(cls, config: ExportConfig, info: SplitInfo, location: str) -> str | None:
        stem, numbers = shard_numbers(info.shards)
        most = max(s.num_samples for s in info.shards) - 1
        columns = ", ".join(sorted({f.column for f in config.fields}))
        return (
            f"numpy.load({location + '/' + stem!r} + SHARD + '/' + SAMPLE + '.' + COLUMN"
            f" + '.npy')  # SHARD: {numbers}; SAMPLE: 000000 to {most:06d} (fewer where a "
            f"shard holds fewer); COLUMN: {columns}"
        )

    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        out = ArrayWriter(storage, stem, listed=False)
        for name in (f"{KEY_COLUMN}.data", f"{KEY_COLUMN}.offsets"):
            out.put_npy(f"{stem}/{name}.npy", columns[name])
        reader = ColumnReader(layout, columns)
        for i in range(len(reader)):
            values = reader.native(i)
            for spec in layout:
                if spec.name not in values:
                    continue
                value = values[spec.name]
                array = (
                    np.frombuffer(value, np.uint8) if spec.kind == "bytes" else np.asarray(value)
                )
                out.put_npy(f"{stem}/{i:06d}.{spec.column}.npy", array)
        # the exporter syncs only what config.yaml lists: the folder, not its files
        storage.sync(out.paths)
        return out.written()
