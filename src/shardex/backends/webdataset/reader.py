"""Reading a split of tar shards: the strategy (mapped, pread, ranged GETs) is picked
once at open, and ``ds[i]`` calls its ``get`` straight away."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING

from shardex.backends.webdataset.access import Access
from shardex.backends.webdataset.local import Mapped, Pread
from shardex.backends.webdataset.ranged import Ranged
from shardex.contract import SplitInfo
from shardex.dataset import Sample, SampleRanges
from shardex.errors import FormatError, ObjectNotFoundError, SampleNotFoundError
from shardex.format.mapped import MemberIndex, key_hash
from shardex.format.tar import iter_members, split_name
from shardex.storage.base import Storage

if TYPE_CHECKING:  # pyarrow and numpy load on first use: opening and reads need neither
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

#: get_many's merge gap for local shards (object storage: its ``coalesce_gap`` option).
DEFAULT_COALESCE_GAP = 0


def pick(storage: Storage, info: SplitInfo) -> type[Access]:
    """Mapped (local, format 3), pread (local, older) or ranged GETs (object storage)."""
    if not all(storage.local_path(s.path) is not None for s in info.shards):
        return Ranged
    assert info.index is not None  # checked by the caller
    return Mapped if info.index.members is not None else Pread


class ShardDataset(SampleRanges):
    """A split of a tar-shard export (the ``webdataset`` backend)."""

    stream_chunk_size = 4 << 20
    #: Per read when iterating local shards: many samples a call, still in the CPU cache.
    read_chunk_size = 1 << 20

    def _open_split(self, info: SplitInfo) -> None:
        if info.index is None:
            raise FormatError(f"split {self.split!r} of {self.storage.uri} has no index")
        self._paths, self._keys_file = [s.path for s in info.shards], info.index.keys
        access = self._access = pick(self.storage, info)(self, info)
        self.index, self._n = access.index, info.num_samples
        self.seed = access.seed
        self._item = access.get  # ds[i]: one attribute load, then the strategy's own code

    def __len__(self) -> int:
        return self._n

    # ds[i] with no Python frame of its own: a C property getter (a wrapper cost ~5 %).
    __getitem__ = property(attrgetter("_item"))

    @property
    def members(self) -> MemberIndex | None:
        """index-members.npy once a read loaded it; None before, and before format 3."""
        return self._access.members

    def check_sample(
        self, buf: bytes | memoryview, checksum: int, shard: int, offset: int, number: int
    ) -> None:
        self._access.check_sample(buf, checksum, shard, offset, number)

    @property
    def records(self) -> npt.NDArray[np.void]:
        """Every sample's index record (on object storage: the whole index fetched)."""
        self._access.whole()
        return self.index.samples

    def from_bytes(
        self, data: bytes, checksum: int, shard: int, offset: int, number: int
    ) -> Sample:
        return self._access.from_bytes(data, checksum, shard, offset, number)

    def field_spans(self, data: bytes, shard: int) -> tuple[tuple[str, int, int], ...]:
        where = self._paths[shard]
        return tuple(
            (split_name(m.name)[1], m.data_offset, m.size) for m in iter_members(data, where=where)
        )

    def get(self, key: str) -> Sample:
        """The sample with this key.

        Raises:
            SampleNotFoundError: no sample has it.
            FormatError: the key table is damaged.
        """
        try:
            return self._get(key)
        except (ObjectNotFoundError, FormatError, SampleNotFoundError) as exc:
            # after an overwrite the lazily read key table may be gone or another export's
            self._access.check_replaced(exc)
            raise

    def _get(self, key: str) -> Sample:
        h = key_hash(key)
        keys_file = self.storage.join(self._keys_file)
        for i in self.index.candidates(key):
            sample = self._item(i)
            found = sample["__key__"]
            if found == key:
                return sample
            if key_hash(found) != h:  # not a hash collision: the entry is wrong
                raise FormatError(
                    f"{keys_file} is damaged: it files sample {i} under the hash of {key!r}, "
                    f"but sample {i} has key {found!r}; `shardex verify` checks the table"
                )
        if not self.index.keys_sorted():
            raise FormatError(
                f"{keys_file} is damaged: its key hashes are out of order, so {key!r} cannot "
                "be looked up; `shardex verify` checks the table"
            )
        raise SampleNotFoundError(
            f"no sample with key {key!r} in split {self.split!r} of {self.storage.uri}"
        )

    def get_many(self, indices: Sequence[int], *, coalesce_gap: int | None = None) -> list[Sample]:
        """Samples in the order asked, read as one batch.

        Reads are sorted per shard, two merged when at most ``coalesce_gap`` bytes apart
        (default: 0, only touching samples merge; on object storage the storage option
        ``coalesce_gap``, where the reads run concurrently and hedged).
        """
        return self._access.get_many(indices, self._gap(coalesce_gap))

    def start_many(
        self, indices: Sequence[int], *, coalesce_gap: int | None = None
    ) -> Callable[[], list[Sample]]:
        """:meth:`get_many` with its requests sent now (on object storage); calling the
        result waits for them and returns the samples."""
        return self._access.start_many(indices, self._gap(coalesce_gap))

    def _gap(self, coalesce_gap: int | None) -> int:
        gap = coalesce_gap if coalesce_gap is not None else self.storage.coalesce_gap
        return DEFAULT_COALESCE_GAP if gap is None else gap

    def __iter__(self) -> Iterator[Sample]:
        """Samples in shard order (remote shards streamed, one GET each)."""
        return self._access.iterate(self.read_chunk_size, self.stream_chunk_size)

    def keys(self) -> Iterator[str]:
        yield from self.metadata.column("key").to_pylist()

    @cached_property
    def metadata(self) -> pa.Table:
        try:
            from shardex.backends.metadata import read_metadata

            return read_metadata(self.storage, self.config, self.split)
        except (FormatError, ObjectNotFoundError) as exc:
            self._access.check_replaced(exc)
            raise
