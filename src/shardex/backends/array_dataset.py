"""The dataset of an array backend's split: blocks of columns, a few runs kept open."""

from __future__ import annotations

import os
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from functools import cached_property

import numpy as np
import pyarrow as pa

from shardex.backends.array_files import load_npy
from shardex.backends.columns import ColumnReader, Columns, Layout, slice_columns
from shardex.backends.metadata import read_metadata
from shardex.contract import ShardInfo, SplitInfo
from shardex.dataset import ReopenedDataset, Sample
from shardex.errors import FormatError, SampleNotFoundError, ShardexError
from shardex.format.index import key_hash

_BLOCK = 256  # samples read together when iterating
_CACHED_RUNS = 4


class ArrayDataset(ReopenedDataset):
    """A split of an array backend; subclasses load one run's columns (:meth:`_load`)."""

    def _open_split(self, info: SplitInfo) -> None:
        self.layout: Layout = self.config.fields
        self.shards = info.shards
        self._first = np.concatenate([[0], np.cumsum([s.num_samples for s in info.shards])])
        self._n = info.num_samples
        self._keys_path = info.keys
        self._cached: OrderedDict[int, ColumnReader] = OrderedDict()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self._n

    @abstractmethod
    def _load(self, shard: ShardInfo) -> Columns:
        """The columns of one run (mapped or lazily read where the format allows)."""

    def _open_run(self, shard: ShardInfo) -> ColumnReader:
        return ColumnReader(self.layout, self._load(shard))

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        return tuple(s.num_samples for s in self.shards)

    def shard_columns(self, shard: int) -> Columns:
        """A run's columns (see :class:`~shardex.dataset.ShardWindows`)."""
        return self._open_run(self.shards[shard]).columns

    def _reader(self, shard: int) -> ColumnReader:
        if self._pid != os.getpid():  # a forked worker reopens: mappings are per process
            self._pid, self._cached = os.getpid(), OrderedDict()
        reader = self._cached.get(shard)
        if reader is None:
            reader = self._cached[shard] = self._open_run(self.shards[shard])
            if len(self._cached) > _CACHED_RUNS:
                self._cached.popitem(last=False)
        self._cached.move_to_end(shard)
        return reader

    def _locate(self, index: int) -> tuple[int, int]:
        n = self._n
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample {index} is out of range for a split of {n} samples")
        shard = int(np.searchsorted(self._first, index, side="right")) - 1
        return shard, index - int(self._first[shard])

    def __getitem__(self, index: int) -> Sample:
        shard, local = self._locate(index)
        return self._reader(shard).sample(local, self.decode)

    @cached_property
    def _key_table(self) -> np.ndarray:
        if self._keys_path is None:
            raise FormatError(f"split {self.split!r} of {self.storage.uri} has no key table")
        return load_npy(self.storage, self._keys_path)

    def get(self, key: str) -> Sample:
        table = self._key_table
        h = np.uint64(key_hash(key))
        pos = int(np.searchsorted(table[0], h, side="left"))
        while pos < table.shape[1] and table[0, pos] == h:
            sample = self[int(table[1, pos])]
            if sample["__key__"] == key:
                return sample
            pos += 1
        raise SampleNotFoundError(
            f"no sample with key {key!r} in split {self.split!r} of {self.storage.uri}"
        )

    def __iter__(self) -> Iterator[Sample]:
        for shard, info in enumerate(self.shards):
            start = int(self._first[shard])
            try:
                reader = self._reader(shard)
            except ShardexError as exc:
                self._lost(range(start, start + info.num_samples), exc)
                continue
            for offset in range(0, info.num_samples, _BLOCK):
                count = min(_BLOCK, info.num_samples - offset)
                first = start + offset
                try:
                    block = self._block(reader, offset, count)
                except ShardexError as exc:  # a damaged array chunk: the block is lost
                    self._lost(range(first, first + count), exc)
                    continue
                for local in range(count):
                    try:
                        sample = block.sample(local, self.decode)
                    except ShardexError as exc:
                        self._lost(range(first + local, first + local + 1), exc)
                        continue
                    yield sample

    def _lost(self, numbers: range, exc: ShardexError) -> None:
        if self.on_error == "raise":
            raise exc
        self.skipped.extend((number, str(exc)) for number in numbers)

    def _block(self, reader: ColumnReader, start: int, count: int) -> ColumnReader:
        return ColumnReader(self.layout, slice_columns(reader.columns, start, count))

    def keys(self) -> Iterator[str]:
        for shard in range(len(self.shards)):
            reader = self._reader(shard)
            for local in range(len(reader)):
                yield reader.key(local)

    @cached_property
    def metadata(self) -> pa.Table:
        return read_metadata(self.storage, self.config, self.split)
