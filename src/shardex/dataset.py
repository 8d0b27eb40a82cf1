"""The one dataset interface every backend's reader returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final, Literal

from shardex.contract import ExportConfig, FieldSpec, SplitInfo
from shardex.storage.base import Storage

if TYPE_CHECKING:  # pyarrow and numpy load on first use: opening needs neither
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

Sample = dict[str, Any]
#: What iteration does with a damaged sample: raise (default) or skip and record it.
OnReadError = Literal["raise", "skip"]


class Dataset(ABC):
    """A split of an export: ``len``, ``ds[i]``, ``ds.get(key)``, iteration, metadata.

    A sample is a dict in WebDataset style: ``"__key__"`` plus one entry per stored field
    (``"jpg"``, ``"cls"``, ``"json"`` ...), raw bytes unless the dataset decodes.
    """

    config: ExportConfig
    split: str

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __getitem__(self, index: int) -> Sample:
        """Sample number ``index`` of the split (negative counts from the end)."""

    @abstractmethod
    def get(self, key: str) -> Sample:
        """The sample with this key. Raises SampleNotFoundError."""

    def get_many(self, indices: Sequence[int]) -> list[Sample]:
        """Several samples, in the order asked; backends batch the reads."""
        return [self[i] for i in indices]

    def start_many(self, indices: Sequence[int]) -> Callable[[], list[Sample]]:
        """:meth:`get_many` started now: backends on object storage send the requests at
        once, so the caller can work while they travel. Calling the result returns the
        samples (raising what ``get_many`` would)."""
        return lambda: self.get_many(indices)

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self)):
            yield self[i]

    @cached_property
    @abstractmethod
    def metadata(self) -> pa.Table:
        """One row per sample of the split, in sample order."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.config.backend!r}, split={self.split!r}, "
            f"num_samples={len(self)})"
        )


#: What a ReopenedDataset pickles: its constructor's arguments, to reopen it with.
_REOPENED_BY: Final = ("storage", "config", "split", "decode", "verify", "on_error")


class ReopenedDataset(Dataset):
    """A dataset that pickles as what opened it and reopens where it is unpickled."""

    storage: Storage
    decode: bool
    verify: bool
    on_error: OnReadError

    #: (sample number, message) of damaged samples that iteration skipped.
    skipped: list[tuple[int, str]]

    def __init__(
        self,
        storage: Storage,
        config: ExportConfig,
        split: str,
        *,
        decode: bool = False,
        verify: bool = True,
        on_error: OnReadError = "raise",
    ) -> None:
        info = config.split(split)
        self.storage, self.config, self.split = storage, config, split
        self.decode, self.verify, self.on_error = decode, verify, on_error
        self.skipped = []
        self._open_split(info)

    def _open_split(self, info: SplitInfo) -> None:
        """Read what the backend needs of its split."""

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _REOPENED_BY}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]


class ShardWindows(ReopenedDataset):
    """A dataset whose shards are runs of whole samples stored as columns (laid out by
    :mod:`shardex.backends.columns`), each loaded whole by ``TensorShardsLoader``."""

    #: The fields of the split, with their column names (config.yaml's ``fields``).
    layout: tuple[FieldSpec, ...]

    @property
    @abstractmethod
    def shard_sizes(self) -> tuple[int, ...]:
        """Samples per shard, in config.yaml's order of the split's shards."""

    @abstractmethod
    def shard_columns(self, shard: int) -> Mapping[str, Any]:
        """Shard ``shard``'s columns by name (anything sliced along its first axis)."""


class SampleRanges(ReopenedDataset):
    """A dataset whose samples are checksummed byte ranges of its shards, so a reader may
    fetch runs of consecutive samples with one request."""

    @property
    @abstractmethod
    def records(self) -> npt.NDArray[np.void]:
        """Per sample: ``offset``, ``length``, ``checksum`` and ``shard`` (its number)."""

    @abstractmethod
    def from_bytes(
        self, data: bytes, checksum: int, shard: int, offset: int, number: int
    ) -> Sample:
        """Sample ``number`` from its bytes (read at ``offset`` of ``shard``), checked when
        the dataset verifies.

        Raises:
            ChecksumError: the bytes are not the sample as exported.
            FormatError: they cannot be parsed.
        """

    def field_spans(self, data: bytes, shard: int) -> tuple[tuple[str, int, int], ...]:
        """``(field, offset within data, size)`` per stored field; empty if not known."""
        return ()
