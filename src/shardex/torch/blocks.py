"""Reading runs of consecutive samples of a shard (at most ``block_bytes``, or one larger
sample), one ``pread`` or ranged GET each, one run ahead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from shardex.dataset import Sample, SampleRanges
from shardex.errors import FormatError
from shardex.torch.order import EpochOrder, Segment

#: Bytes read at once from a shard (a run of consecutive samples; one sample if larger).
DEFAULT_BLOCK_BYTES: Final = 64 << 20


@dataclass(frozen=True, slots=True)
class Block:
    """A run of consecutive samples of one shard, read with one request."""

    shard: int
    first: int  # sample number of the run's first sample
    offsets: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    checksums: npt.NDArray[np.uint64]


def blocks(
    ds: SampleRanges, order: EpochOrder, segments: Sequence[Segment], block_bytes: int
) -> Iterator[Block]:
    """The runs of consecutive samples to read for some positions, in order."""
    records = ds.records
    for start, stop in segments:
        for shard, first, count in order.runs(start, stop):
            rec = records[first : first + count]
            offsets = rec["offset"].astype(np.int64)
            lengths = rec["length"].astype(np.int64)
            checksums = np.asarray(rec["checksum"], dtype=np.uint64)
            ends = offsets + lengths
            ordered = bool(np.all(offsets[1:] >= ends[:-1]))
            i = 0
            while i < count:
                j = i + 1
                if ordered:  # extend the run while it stays within block_bytes
                    limit = int(offsets[i]) + block_bytes
                    j = max(j, int(np.searchsorted(ends, limit, side="right")))
                yield Block(shard, first + i, offsets[i:j], lengths[i:j], checksums[i:j])
                i = j


def read_blocks(ds: SampleRanges, runs: Iterator[Block]) -> Iterator[tuple[int, Sample]]:
    """``(sample number, raw sample)`` of each block's samples, the next block read ahead."""
    storage = ds.storage
    shards = ds.config.split(ds.split).shards

    def fetch(block: Block) -> bytes:
        start = int(block.offsets[0])
        end = int(block.offsets[-1] + block.lengths[-1])
        info = shards[block.shard]
        if end > info.num_bytes:
            raise FormatError(
                f"index entry points past the end of {storage.join(info.path)} "
                f"({end} > {info.num_bytes} bytes)"
            )
        data = storage.get_range(info.path, start, end - start)
        if len(data) != end - start:
            raise FormatError(f"{storage.join(info.path)} is shorter than its index says")
        return data

    with ThreadPoolExecutor(1, thread_name_prefix="shardex-prefetch") as pool:
        block = next(runs, None)
        pending: Future[bytes] | None = None if block is None else pool.submit(fetch, block)
        while block is not None and pending is not None:
            data = pending.result()
            current, block = block, next(runs, None)
            pending = None if block is None else pool.submit(fetch, block)
            yield from _parse(ds, current, data)


def _parse(ds: SampleRanges, block: Block, data: bytes) -> Iterator[tuple[int, Sample]]:
    base = int(block.offsets[0])
    for k, (offset, length, checksum) in enumerate(
        zip(block.offsets.tolist(), block.lengths.tolist(), block.checksums.tolist(), strict=True)
    ):
        buf = data[offset - base : offset - base + length]
        yield block.first + k, ds.from_bytes(buf, checksum, block.shard, offset, block.first + k)
