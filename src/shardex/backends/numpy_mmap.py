"""``numpy_mmap``: one ``.npy`` file per column per split, memory-mapped for reading.

Layout of a split ``S`` (see :mod:`shardex.backends.columns` for the column names)::

    S/arrays-{hash}/{column}.npy            fixed fields: shape (N, ...)
    S/arrays-{hash}/{column}.data.npy       ragged fields: values back to back
    S/arrays-{hash}/{column}.offsets.npy    ... and N + 1 offsets (int64)
    S/arrays-{hash}/{column}.shapes.npy     ... and per-sample shapes (arrays)
    S/arrays-{hash}-keys.npy                sorted key hashes -> sample number

Every file opens with ``numpy.load(path, mmap_mode="r")``; sample ``i`` costs O(1).
"""

from __future__ import annotations

import io
from typing import ClassVar

import numpy as np

from shardex.backends.arrays import ArrayBackend, ArrayDataset, ArrayWriter, Written
from shardex.backends.base import Capabilities
from shardex.backends.columns import Columns, Layout
from shardex.contract import ExportConfig, ShardInfo
from shardex.errors import FormatError, ObjectNotFoundError
from shardex.storage.base import Storage


class NumpyMmapDataset(ArrayDataset):
    """A split of a ``numpy_mmap`` export: every column memory-mapped (local) or read once."""

    def _load(self, shard: ShardInfo) -> Columns:
        out = {}
        for path in self.config.split(self.split).files:
            if not path.startswith(f"{shard.path}/"):
                continue
            name = path[len(shard.path) + 1 : -len(".npy")]
            local = self.storage.local_path(path)
            try:
                if local is not None:
                    out[name] = np.load(local, mmap_mode="r", allow_pickle=False)
                else:
                    out[name] = np.load(io.BytesIO(self.storage.get(path)), allow_pickle=False)
            except FileNotFoundError as exc:
                raise ObjectNotFoundError(f"{self.storage.join(path)} is missing") from exc
            except (ValueError, OSError, EOFError) as exc:
                where = self.storage.join(path)
                raise FormatError(f"{where}: not a readable .npy array ({exc})") from exc
        return out


class NumpyMmapBackend(ArrayBackend):
    """One memory-mappable ``(N, ...)`` array per fixed field; ragged fields as data + offsets."""

    name: ClassVar[str] = "numpy_mmap"
    description: ClassVar[str] = "one .npy per key per split, memory-mapped (N, ...)"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True, streaming=True, remote=True
    )
    per_split: ClassVar[bool] = True
    stem_name: ClassVar[str] = "arrays"
    dataset: ClassVar[type[ArrayDataset]] = NumpyMmapDataset

    @classmethod
    def plain_reader(cls, config: ExportConfig, split: str, location: str) -> str | None:
        info = config.split(split)
        if not info.shards or "://" in location:  # numpy maps local files only
            return None
        folder = info.shards[0].path
        columns = [
            f[len(folder) + 1 : -len(".npy")] for f in info.files if f.startswith(f"{folder}/")
        ]
        where = f"{location}/{folder}/"
        return f"numpy.load({where!r} + COLUMN + '.npy', mmap_mode='r')  # COLUMN: {', '.join(columns)}"

    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        out = ArrayWriter(storage, stem, listed=True)
        for name in sorted(columns):
            out.put_npy(f"{stem}/{name}.npy", columns[name])
        return out.written()
