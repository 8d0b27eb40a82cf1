"""A distributed sampler: exactly equal shares per rank, a global O(1)-memory shuffle, resume."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import numpy as np
from torch.utils.data import Sampler

from shardex.errors import ConfigError
from shardex.torch.distributed import check_state, rank_share, resolve_ranks
from shardex.torch.permutation import IndexPermutation

STATE_KIND: Final = "shardex.ShardexSampler"
ITERATOR_KIND: Final = "shardex.ShardexSampler.iterator"
#: The settings a state records, and must match when it is loaded.
_SETUP: Final = ("dataset_len", "world_size", "shuffle", "seed", "drop_last")
_CHUNK: Final = 4096


class ShardexSampler(Sampler[int]):
    """Indices of one rank's share of an epoch, for a map-style dataset.

    The epoch's order is a seeded O(1)-memory permutation
    (:class:`~shardex.torch.permutation.IndexPermutation`), the same on every rank; rank
    ``r`` takes positions ``r, r + world_size, ...``, so every rank gets ``len(sampler)``
    indices. Without ``drop_last`` the order is padded by repeating its first samples;
    with it, the last ``dataset_len % world_size`` positions are left out. To resume, save
    and load a ``torchdata`` ``StatefulDataLoader``'s state, or call :meth:`advance` after
    each batch of a plain DataLoader and save :meth:`state_dict` (any rank's, any workers).

    Args:
        dataset_len: ``len(dataset)``.
        rank, world_size: default torch.distributed's, else 0 of 1.
        shuffle, seed: shuffle each epoch (else ``0, 1, 2, ...``), seeded alike on all ranks.
        drop_last: drop the tail instead of padding.
    """

    def __init__(
        self,
        dataset_len: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if dataset_len < 0:
            raise ConfigError(f"dataset_len must be >= 0, got {dataset_len}")
        self.dataset_len = dataset_len
        self.rank, self.world_size = resolve_ranks(rank, world_size)
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.num_samples = rank_share(dataset_len, self.world_size, drop_last=drop_last)
        self.epoch = 0
        self._epoch_set: int | None = None  # the epoch last given to set_epoch()
        self._resume_at = 0  # where the next pass starts (set by load_state_dict)
        self._consumed = 0  # samples of this epoch handed to the training loop

    def __len__(self) -> int:
        """Indices per rank and epoch (a resumed pass yields fewer: the rest of the epoch)."""
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's order for the next pass (a new epoch forgets a resume point)."""
        self._epoch_set = epoch
        if epoch != self.epoch:
            self.epoch, self._resume_at, self._consumed = epoch, 0, 0

    def advance(self, n: int) -> None:
        """Record that the training loop has taken ``n`` more samples of this epoch."""
        if n < 0 or self._consumed + n > self.num_samples:
            raise ConfigError(
                f"advance({n}) after {self._consumed} consumed samples would pass the end of "
                f"this rank's {self.num_samples} samples per epoch"
            )
        self._consumed += n

    def __iter__(self) -> SamplerIterator:
        start, self._resume_at = self._resume_at, 0
        self._consumed = start
        return SamplerIterator(self, start)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able record of the epoch and the samples consumed on this rank."""
        return {
            "kind": STATE_KIND,
            "version": 1,
            **self._setup(),
            "epoch": self.epoch,
            "consumed": self._consumed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass yields the rest of its epoch
        (a ConfigError if it was saved with other settings)."""
        check_state(state, STATE_KIND, self._setup())
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.num_samples:
            raise ConfigError(f"the state's consumed={consumed} is outside this rank's share")
        self.epoch, self._resume_at, self._consumed = int(state["epoch"]), consumed, consumed

    def _setup(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _SETUP}


class SamplerIterator(Iterator[int]):
    """One pass of a :class:`ShardexSampler`, counting the indices it gave out:
    ``StatefulDataLoader`` saves the count per batch, so no ``advance`` calls are needed."""

    def __init__(self, sampler: ShardexSampler, start: int) -> None:
        self.sampler = sampler
        self._seek(sampler.epoch, start)

    def _seek(self, epoch: int, position: int) -> None:
        self.epoch, self.position = epoch, position
        n = self.sampler.dataset_len
        self._perm = (
            IndexPermutation(n, self.sampler.seed, epoch) if self.sampler.shuffle and n else None
        )
        self._chunk: list[int] = []
        self._at = 0  # next item of _chunk

    def __iter__(self) -> SamplerIterator:
        return self

    def __next__(self) -> int:
        if self._at == len(self._chunk):
            self._chunk, self._at = self._indices(), 0
            if not self._chunk:
                raise StopIteration
        self._at += 1
        self.position += 1
        return self._chunk[self._at - 1]

    def _indices(self) -> list[int]:
        sampler = self.sampler
        stop = min(self.position + _CHUNK, sampler.num_samples)
        at = np.arange(self.position, stop, dtype=np.int64) * sampler.world_size + sampler.rank
        at %= max(sampler.dataset_len, 1)
        return (at if self._perm is None else self._perm.map(at)).tolist()  # type: ignore[no-any-return]

    def state_dict(self) -> dict[str, Any]:
        """``{"kind", "epoch", "yielded"}``: the position in this rank's share."""
        return {"kind": ITERATOR_KIND, "epoch": self.epoch, "yielded": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved position, unless ``set_epoch`` chose another epoch
        (StatefulDataLoader loads state after the loop's ``set_epoch``): then its start."""
        check_state(state, ITERATOR_KIND, {})
        epoch, yielded = int(state["epoch"]), int(state["yielded"])
        if not 0 <= yielded <= self.sampler.num_samples:
            raise ConfigError(f"the state's yielded={yielded} is outside this rank's share")
        chosen = self.sampler._epoch_set
        if chosen is not None and chosen != epoch:
            epoch, yielded = chosen, 0
        self.sampler.epoch, self.sampler._consumed = epoch, yielded
        self._seek(epoch, yielded)
