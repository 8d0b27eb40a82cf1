"""The sample sequence of a streaming epoch (shards in a seeded order, positions past the
end wrapping to its start), and how a rank's *plan* of segments is cut into one
contiguous *piece* per DataLoader worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardex.torch.permutation import IndexPermutation, derive_key

Segment = tuple[int, int]
#: Salt that keeps the shard order independent of a sampler's order for the same seed.
_SHARD_SALT = 0x5A4D


@dataclass(frozen=True, slots=True)
class EpochOrder:
    """Shard order and sample positions of one epoch."""

    order: npt.NDArray[np.int64]  # shard numbers, in epoch order
    starts: npt.NDArray[np.int64]  # position where each ordered shard starts (+ the total)
    first: npt.NDArray[np.int64]  # first sample number of each shard, by shard number

    @classmethod
    def make(cls, counts: Sequence[int], *, shuffle: bool, seed: int, epoch: int) -> EpochOrder:
        """The order for shards holding ``counts`` samples each (in split order)."""
        sizes = np.asarray(counts, dtype=np.int64)
        order = np.arange(len(sizes), dtype=np.int64)
        if shuffle and len(sizes) > 1:
            order = IndexPermutation(len(sizes), derive_key(seed, _SHARD_SALT), epoch).map(order)
        first = np.concatenate([[0], np.cumsum(sizes)])[:-1].astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes[order])]).astype(np.int64)
        return cls(order, starts, first)

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    def runs(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """``(shard, first sample number, count)`` runs covering positions [start, stop)."""
        n = self.num_samples
        while start < stop:
            q = start % n
            k = int(np.searchsorted(self.starts, q, side="right")) - 1
            shard = int(self.order[k])
            take = min(stop - start, int(self.starts[k + 1]) - q)
            yield shard, int(self.first[shard]) + q - int(self.starts[k]), take
            start += take

    def sample_numbers(self, positions: Sequence[int]) -> list[int]:
        """The sample number at each position."""
        q = np.asarray(positions, dtype=np.int64) % self.num_samples
        k = np.searchsorted(self.starts, q, side="right") - 1
        return (self.first[self.order[k]] + q - self.starts[k]).tolist()  # type: ignore[no-any-return]


def plan_length(plan: Sequence[Segment]) -> int:
    return sum(stop - start for start, stop in plan)


def piece_sizes(total: int, workers: int) -> list[int]:
    """Samples of each worker's piece: equal, the first ``total % workers`` one more."""
    return [total // workers + (w < total % workers) for w in range(workers)]


def cut(plan: Sequence[Segment], lo: int, hi: int) -> list[Segment]:
    """The segments of positions ``lo .. hi - 1`` of a plan (offsets into the plan)."""
    out: list[Segment] = []
    at = 0
    for start, stop in plan:
        size = stop - start
        a, b = max(lo - at, 0), min(hi - at, size)
        if a < b:
            out.append((start + a, start + b))
        at += size
        if at >= hi:
            break
    return out


def worker_piece(plan: Sequence[Segment], workers: int, worker: int) -> list[Segment]:
    """The contiguous piece of a plan that one of ``workers`` workers reads."""
    sizes = piece_sizes(plan_length(plan), workers)
    lo = sum(sizes[:worker])
    return cut(plan, lo, lo + sizes[worker])


def positions(segments: Sequence[Segment]) -> Iterator[int]:
    for start, stop in segments:
        yield from range(start, stop)


def merge(segments: Sequence[Segment]) -> list[Segment]:
    """The same positions in the same order, touching segments joined."""
    out: list[Segment] = []
    for start, stop in segments:
        if start == stop:
            continue
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out
