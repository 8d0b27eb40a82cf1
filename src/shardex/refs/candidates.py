"""A shard job's candidate samples: a slice of a split's spill file, which the writer
reads itself (:meth:`Candidates.loaded`), or its rows carried to a remote worker.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.refs.members import Members
from shardex.refs.rows import SpilledRows, SpillSlice

_NO_ROWS: Final = pa.table({})
_NO_MEMBERS: Final = Members.empty()
_NO_SIZES: Final = np.zeros(0, np.int64)


@dataclass(frozen=True, slots=True)
class Candidates:
    """A job's candidates, in order: ``rows`` (no members), members (candidate ``i`` is sample
    ``member_rows[i]``), planned sizes; ``last``: they end the split; ``spill``: a slice the
    writer reads itself when the job does not carry them.
    """

    rows: pa.Table
    members: Members
    member_rows: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    last: bool
    spill: SpillSlice | None = None

    def loaded(self) -> Candidates:
        """These candidates with their spill slice read (rows kept by Ray bring their sizes)."""
        if self.spill is None:
            return self
        rows, members, sizes = self.spill.read_sized()
        every = np.arange(rows.num_rows, dtype=np.int64)
        return Candidates(rows, members, every, self.sizes if sizes is None else sizes, self.last)

    def carried(self, read: dict[int, pa.RecordBatch]) -> Candidates:
        """These candidates with the spill slice's rows read in, for a worker on another machine."""
        if self.spill is None:
            return self
        return dataclasses.replace(self, spill=self.spill.carried(read))


def spilled_candidates(split: SpilledRows, start: int, stop: int) -> Candidates:
    """The candidates ``[start, stop)`` of a spilled split: a spill-file slice, and sizes."""
    return Candidates(
        _NO_ROWS,
        _NO_MEMBERS,
        np.zeros(0, np.int64),
        # rows in a remote runner's object store hold their sizes: none read here
        _NO_SIZES if split.refs else np.asarray(split.sizes[start:stop]),
        stop >= split.num_samples,
        split.slice(start, stop),
    )
