"""The keys already in an export, for an append, as sorted 64-bit hashes (8 bytes a key,
not a Python string); a hash match is confirmed against the keys, read back once a batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow.parquet as pq
import xxhash


def key_hash(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass"))


def _hashes(keys: Iterable[str]) -> npt.NDArray[np.uint64]:
    return np.fromiter((key_hash(k) for k in keys), np.uint64)


class TakenKeys(frozenset[str]):
    """Keys of the export whose metadata.parquet is at ``path``: a frozenset to the key
    checks (``in``, :meth:`isdisjoint`), holding no key itself."""

    _hashes: npt.NDArray[np.uint64]
    _path: Path
    _found: dict[int, set[str]]

    def __new__(cls, path: Path) -> TakenKeys:
        taken = super().__new__(cls)
        file = pq.ParquetFile(path)
        parts = [
            _hashes(batch.column(0).to_pylist())
            for batch in file.iter_batches(columns=["key"], batch_size=1 << 16)
        ]
        taken._hashes = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)
        taken._path, taken._found = path, {}
        return taken

    def __len__(self) -> int:
        return len(self._hashes)

    def __bool__(self) -> bool:
        return len(self._hashes) > 0

    def _hit(self, hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        at = np.minimum(np.searchsorted(self._hashes, hashes), max(len(self._hashes) - 1, 0))
        if not len(self._hashes):
            return np.zeros(len(hashes), bool)
        return np.asarray(self._hashes[at] == hashes)

    def _resolve(self, hashes: Iterable[int]) -> None:
        wanted = {h for h in hashes if h not in self._found}
        if not wanted:
            return
        for h in wanted:
            self._found[h] = set()
        file = pq.ParquetFile(self._path)
        for batch in file.iter_batches(columns=["key"], batch_size=1 << 16):
            keys = batch.column(0).to_pylist()
            for key, h in zip(keys, _hashes(keys).tolist(), strict=True):
                if h in wanted:
                    self._found[h].add(key)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        h = key_hash(key)
        if not self._hit(np.array([h], np.uint64))[0]:
            return False
        self._resolve([h])
        return key in self._found[h]

    def isdisjoint(self, keys: Iterable[object]) -> bool:
        """Whether none of ``keys`` is taken (all matches confirmed in one read)."""
        strings = [k for k in keys if isinstance(k, str)]
        hashes = _hashes(strings)
        hits = self._hit(hashes)
        if not hits.any():
            return True
        self._resolve(hashes[hits].tolist())
        return not any(
            k in self._found[h]
            for k, h in zip(strings, hashes.tolist(), strict=True)
            if h in self._found
        )
