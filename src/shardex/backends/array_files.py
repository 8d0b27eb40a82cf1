"""The files of an array backend's runs: writing them, and reading run parts back."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from shardex.errors import FormatError
from shardex.fields import npy_bytes
from shardex.format.tables import read_npy, shard_checksum
from shardex.storage.base import Storage


def load_npy(storage: Storage, path: str) -> np.ndarray:
    """A ``.npy`` file's array: mapped when the file is local, else read whole."""
    local = storage.local_path(path)
    if local is not None:
        return np.load(local, mmap_mode="r", allow_pickle=False)  # type: ignore[no-any-return]
    return read_npy(storage, path, ".npy")  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Written:
    """A run's path (file or folder), the files config.yaml lists, size and checksum."""

    path: str
    files: tuple[str, ...]
    num_bytes: int
    checksum: str
    paths: tuple[str, ...] = ()


class ArrayWriter:
    """Writes a run's files, checksumming them."""

    def __init__(self, storage: Storage, path: str, *, listed: bool) -> None:
        self.storage, self.path, self.listed = storage, path, listed
        self.files: list[str] = []
        self.paths: list[str] = []
        self.num_bytes = 0
        self._hash = xxhash.xxh3_64()

    def put(self, path: str, data: bytes) -> None:
        self.storage.put(path, data)
        self.paths.append(path)
        if self.listed:
            self.files.append(path)
        self.num_bytes += len(data)
        self._hash.update(data)

    def put_npy(self, path: str, array: np.ndarray) -> None:
        self.put(path, npy_bytes(array))

    def written(self) -> Written:
        return Written(
            self.path,
            tuple(self.files),
            self.num_bytes,
            shard_checksum(self._hash),
            tuple(self.paths),
        )


def put_npys(storage: Storage, stem: str, columns: Mapping[str, np.ndarray]) -> Written:
    """Write each column as ``{stem}/{name}.npy``, in name order."""
    out = ArrayWriter(storage, stem, listed=True)
    for name in sorted(columns):
        out.put_npy(f"{stem}/{name}.npy", columns[name])
    return out.written()


def load_part(storage: Storage, run: Written) -> dict[str, np.ndarray]:
    """A run's parts: column name -> array (mapped when local)."""
    return {path[len(run.path) + 1 : -len(".npy")]: load_npy(storage, path) for path in run.files}


def npy_header_bytes(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``np.save`` writes for this dtype and shape."""
    out = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()


def npy_header(storage: Storage, path: str) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """The dtype, shape and data offset of a ``.npy`` file, from its header."""
    head = io.BytesIO(storage.get_range(path, 0, min(storage.size(path), 4096)))
    version = np.lib.format.read_magic(head)
    if version != (1, 0):
        raise FormatError(f"{storage.join(path)}: .npy version {version}, expected 1.0")
    shape, fortran, dtype = np.lib.format.read_array_header_1_0(head)
    if fortran:
        raise FormatError(f"{storage.join(path)}: a Fortran-order .npy, expected C order")
    return dtype, shape, head.tell()


class PartColumn:
    """A split's column as its runs' parts joined (offsets re-based), read a row range
    at a time: the column is never held."""

    def __init__(self, storage: Storage, paths: list[str], offsets: bool) -> None:
        self.storage, self.paths, self.offsets = storage, paths, offsets
        heads = [npy_header(storage, p) for p in paths]
        self.dtype = heads[0][0]
        self.tail = tuple(int(d) for d in heads[0][1][1:])
        self._row = self.dtype.itemsize * int(np.prod(self.tail, dtype=np.int64))
        self._at = [at for _, _, at in heads]
        # an .offsets part's first value (0) is the end of the part before: dropped
        self._skip = [1 if offsets and k else 0 for k in range(len(paths))]
        counts = [
            int(shape[0]) - skip for (_, shape, _), skip in zip(heads, self._skip, strict=True)
        ]
        self._first = np.zeros(len(paths) + 1, np.int64)
        np.cumsum(counts, out=self._first[1:])
        self._base = np.zeros(len(paths), np.int64)
        if offsets:  # each part's last offset, summed over the parts before it
            ends = [self._read(k, int(shape[0]) - 1, 1)[0] for k, (_, shape, _) in enumerate(heads)]
            self._base[1:] = np.cumsum(ends)[:-1]

    def __len__(self) -> int:
        return int(self._first[-1])

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.tail)

    def _read(self, k: int, start: int, count: int) -> np.ndarray:
        data = self.storage.get_range(
            self.paths[k], self._at[k] + start * self._row, count * self._row
        )
        return np.frombuffer(data, self.dtype).reshape(count, *self.tail)

    def rows(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        k = int(np.searchsorted(self._first, start, side="right")) - 1
        while start < stop and k < len(self.paths):
            end = min(stop, int(self._first[k + 1]))
            local = start - int(self._first[k]) + self._skip[k]
            piece = self._read(k, local, end - start)
            pieces.append(piece + self._base[k] if self.offsets else piece)
            start, k = end, k + 1
        if not pieces:
            return np.zeros((0, *self.tail), self.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def part_columns(storage: Storage, runs: list[Written]) -> dict[str, PartColumn]:
    """A split's columns as its runs' parts, none read yet."""
    names = [p[len(runs[0].path) + 1 : -len(".npy")] for p in runs[0].files]
    return {
        name: PartColumn(
            storage, [f"{run.path}/{name}.npy" for run in runs], name.endswith(".offsets")
        )
        for name in names
    }


def remove_run(storage: Storage, written: Written | None) -> None:
    """Delete what a run wrote."""
    if written is not None:
        for path in written.paths or (written.path, *written.files):
            storage.delete(path)
