"""Shards that are one file of a run's columns, read whole and checked (``torch``,
``tensor_shards``): a backend says only how columns become bytes and back."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import xxhash

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.array_files import ArrayWriter, Written
from shardex.backends.arrays import ArrayBackend, shard_numbers
from shardex.backends.base import Capabilities
from shardex.backends.columns import Columns, Layout
from shardex.contract import ExportConfig, ShardInfo, SplitInfo
from shardex.dataset import ShardWindows
from shardex.errors import ChecksumError
from shardex.format.tables import shard_checksum
from shardex.storage.base import Storage


class OneFileDataset(ArrayDataset, ShardWindows):
    """A split of one-file shards; ``ds[i]`` reads (and caches) its whole shard."""

    @staticmethod
    @abstractmethod
    def decode_shard(data: bytes, where: str) -> Columns:
        """A shard's columns from its bytes (``where`` names it in errors)."""

    def _load(self, shard: ShardInfo) -> Columns:
        data = self.storage.get(shard.path)
        if self.verify:
            found = shard_checksum(xxhash.xxh3_64(data))
            if found != shard.checksum:
                raise ChecksumError(
                    f"{self.storage.join(shard.path)}: checksum {found} differs from "
                    f"{shard.checksum} in config.yaml; the shard is damaged (shardex verify)"
                )
        return self.decode_shard(data, self.storage.join(shard.path))


class OneFileBackend(ArrayBackend):
    """Writes each run as the one file ``{stem}.{extension}``."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=False,
        streaming=True,
        remote=True,
        checked_reads=True,
        shard_windows=True,
        bfloat16=True,  # torch: bfloat16 tensors; tensor_shards: their bits (uint16)
    )
    stem_name: ClassVar[str] = "tensors"
    extension: ClassVar[str]  # without the dot
    #: The stock call that loads a shard file, ``{}`` its path.
    loader: ClassVar[str]

    @classmethod
    def reader_call(cls, config: ExportConfig, info: SplitInfo, location: str) -> str | None:
        suffix = f".{cls.extension}"
        stem, numbers = shard_numbers(info.shards, suffix)
        path = f"{location + '/' + stem!r} + SHARD + {suffix!r}"
        return f"{cls.loader.format(path)}  # SHARD: {numbers}"

    @abstractmethod
    def encode_run(self, columns: Columns, layout: Layout) -> bytes:
        """The bytes of the file holding a run's columns."""

    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        path = f"{stem}.{self.extension}"
        out = ArrayWriter(storage, path, listed=False)
        out.put(path, self.encode_run(columns, layout))
        return out.written()
