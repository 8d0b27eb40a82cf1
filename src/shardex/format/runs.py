"""Fixed-size records partitioned into runs by the top bits of a 64-bit hash, read back
run by run, each stably sorted: all records sorted with no heap and no full copy in memory
(repeated keys, key tables). The first :data:`MEMORY_RECORDS` never touch the disk.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

#: 64 runs: a 100M-sample split puts about 1.6M records (26 MB) in each.
RUN_BITS: Final = 6
_RUNS: Final = 1 << RUN_BITS
MEMORY_RECORDS: Final = 1 << 20  # 16 MB of 16-byte key records: a million samples


class HashRuns:
    """Records sorted by their uint64 field ``h``: in memory up to ``memory``, then in run files."""

    def __init__(
        self, folder: Path, name: str, dtype: np.dtype[Any], memory: int | None = None
    ) -> None:
        self.dtype = dtype
        self._paths = [folder / f"{name}-{r:02d}.bin" for r in range(_RUNS)]
        self._files: list[Any] = [None] * _RUNS
        self._held: list[npt.NDArray[Any]] = []
        self._memory = MEMORY_RECORDS if memory is None else memory
        self._held_count = 0
        self._written = False
        self.count = 0

    def add(self, records: npt.NDArray[Any]) -> None:
        if not len(records):
            return
        self.count += len(records)
        if self._held_count + len(records) <= self._memory:
            self._held.append(records.copy())
            self._held_count += len(records)
            return
        self._write(records if not self._held else np.concatenate([*self._held, records]))
        self._held, self._held_count = [], 0

    def _write(self, records: npt.NDArray[Any]) -> None:
        self._written = True
        for r, part in _by_run(records):
            if self._files[r] is None:
                self._files[r] = open(self._paths[r], "ab")  # noqa: SIM115  # closed in close()
            self._files[r].write(part.tobytes())

    def close(self) -> None:
        for f in self._files:
            if f is not None:
                f.close()
        self._files = [None] * _RUNS

    def sorted_runs(self) -> Iterator[npt.NDArray[Any]]:
        """Each run, sorted by hash (stable: ties in the order they were added)."""
        held = np.concatenate(self._held) if self._held else None
        if held is not None and not self._written:
            # nothing written: the runs from memory (the same records, the same order)
            for _, part in _by_run(held):
                yield part[np.argsort(part["h"], kind="stable")]
            return
        if held is not None:  # after those written: arrived last
            self._write(held)
            self._held, self._held_count = [], 0
        self.close()
        for path in self._paths:
            if path.exists():
                run = np.fromfile(path, self.dtype)
                yield run[np.argsort(run["h"], kind="stable")]

    def remove(self) -> None:
        self.close()
        self._held, self._held_count = [], 0
        for path in self._paths:
            path.unlink(missing_ok=True)


def _by_run(records: npt.NDArray[Any]) -> Iterator[tuple[int, npt.NDArray[Any]]]:
    """Each run's records (in arrival order), by run number."""
    run = (records["h"] >> np.uint64(64 - RUN_BITS)).astype(np.intp)
    order = np.argsort(run, kind="stable")
    bounds = np.searchsorted(run[order], np.arange(_RUNS + 1))
    for r in np.flatnonzero(np.diff(bounds)).tolist():
        yield r, records[order[bounds[r] : bounds[r + 1]]]
