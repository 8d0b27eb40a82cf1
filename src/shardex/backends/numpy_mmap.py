"""``numpy_mmap``: ``S/arrays-{hash}/{column}.npy`` per column per split, opened with
``numpy.load(path, mmap_mode="r")``; see docs/backends.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Final

import numpy as np
import xxhash

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.array_files import Written, load_npy, npy_header, npy_header_bytes, put_npys
from shardex.backends.arrays import ArrayBackend
from shardex.backends.base import Capabilities
from shardex.backends.columns import Columns, Layout
from shardex.contract import ExportConfig, ShardInfo, SplitInfo
from shardex.errors import FormatError, ObjectNotFoundError
from shardex.format.tables import shard_checksum
from shardex.storage.base import Storage


class NumpyMmapDataset(ArrayDataset):
    def _load(self, shard: ShardInfo) -> Columns:
        out = {}
        for path in self.config.split(self.split).files:
            if not path.startswith(f"{shard.path}/"):
                continue
            name = path[len(shard.path) + 1 : -len(".npy")]
            try:
                out[name] = load_npy(self.storage, path)
            except FileNotFoundError as exc:
                raise ObjectNotFoundError(f"{self.storage.join(path)} is missing") from exc
            except (ValueError, OSError, EOFError) as exc:
                where = self.storage.join(path)
                raise FormatError(f"{where}: not a readable .npy array ({exc})") from exc
        return out


class NumpyMmapBackend(ArrayBackend):
    name: ClassVar[str] = "numpy_mmap"
    description: ClassVar[str] = "one .npy per key per split, memory-mapped (N, ...)"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True, streaming=True, remote=True
    )
    per_split: ClassVar[bool] = True
    stem_name: ClassVar[str] = "arrays"
    dataset: ClassVar[type[ArrayDataset]] = NumpyMmapDataset

    @classmethod
    def reader_call(cls, config: ExportConfig, info: SplitInfo, location: str) -> str | None:
        folder = info.shards[0].path
        columns = [
            f[len(folder) + 1 : -len(".npy")] for f in info.files if f.startswith(f"{folder}/")
        ]
        where = f"{location}/{folder}/"
        return f"numpy.load({where!r} + COLUMN + '.npy', mmap_mode='r')  # COLUMN: {', '.join(columns)}"

    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        return put_npys(storage, stem, columns)

    def join_runs(
        self, storage: Storage, stem: str, runs: list[Written], layout: Layout, num_samples: int
    ) -> Written:
        """Each column's parts copied behind one header, a chunk at a time: the bytes
        :meth:`write_run` would write, without holding a column."""
        hasher = xxhash.xxh3_64()
        files: list[str] = []
        num_bytes = 0
        for part in runs[0].files:  # in column name order, as write_run writes them
            name = part[len(runs[0].path) + 1 :]
            path = f"{stem}/{name}"
            with storage.open_writer(path) as out:
                for chunk in _joined(storage, [f"{run.path}/{name}" for run in runs], name):
                    out.write(chunk)
                    hasher.update(chunk)
                    num_bytes += len(chunk)
            files.append(path)
        return Written(stem, tuple(files), num_bytes, shard_checksum(hasher), tuple(files))


_COPY: Final = 4 << 20


def _joined(storage: Storage, parts: list[str], name: str) -> Iterator[bytes]:
    """The ``.npy`` bytes of the parts joined along the first axis (offsets re-based)."""
    heads = [npy_header(storage, p) for p in parts]
    dtype, first, _ = heads[0]
    offsets = name.endswith(".offsets.npy")
    rows = sum(shape[0] for _, shape, _ in heads) - (len(parts) - 1 if offsets else 0)
    yield npy_header_bytes(dtype, (rows, *first[1:]))
    base = 0
    for k, (path, (_, shape, at)) in enumerate(zip(parts, heads, strict=True)):
        if offsets:  # n + 1 int64s a run: small, read whole
            values = np.frombuffer(storage.get_range(path, at, 8 * shape[0]), "<i8")
            yield (values[0 if k == 0 else 1 :] + base).astype("<i8").tobytes()
            base += int(values[-1])
            continue
        size = storage.size(path) - at
        for start in range(0, size, _COPY):
            yield storage.get_range(path, at + start, min(_COPY, size - start))
