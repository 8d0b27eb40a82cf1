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
#: Indices computed per numpy pass while iterating.
_CHUNK: Final = 4096


class ShardexSampler(Sampler[int]):
    """Indices of one rank's share of an epoch, for a map-style dataset.

    The epoch's order is a seeded bijective permutation of ``range(dataset_len)`` (see
    :class:`~shardex.torch.permutation.IndexPermutation`), new for each epoch and the same on
    every rank; nothing of size ``dataset_len`` is ever built. Rank ``r`` takes positions
    ``r, r + world_size, r + 2 * world_size, ...`` of that order, so every rank gets exactly
    ``len(sampler)`` indices:

    * ``drop_last=False`` (default): the order is padded to a multiple of ``world_size`` by
      repeating its first samples (at most ``world_size - 1`` repeats per epoch);
    * ``drop_last=True``: the last ``dataset_len % world_size`` positions of the order are
      left out (different samples each epoch, since the order changes).

    Resuming: the sampler does not know how many of the indices it gave out have reached
    the training loop (the DataLoader fetches ahead), so the loop tells it with
    :meth:`advance` after each batch. :meth:`state_dict` then records the epoch and the
    number of samples consumed on this rank; after :meth:`load_state_dict` (in a fresh
    process) the next pass starts right after them, in the same order. The state does not
    depend on ``num_workers`` or the batch size, and every rank consumes the same number,
    so the state of any rank can be loaded on every rank.

    Args:
        dataset_len: the number of samples in the dataset (``len(dataset)``).
        rank: this process's rank; default torch.distributed's, or 0.
        world_size: the number of ranks; default torch.distributed's, or 1.
        shuffle: shuffle each epoch; if False the order is ``0, 1, 2, ...``.
        seed: the shuffle seed; the same on every rank.
        drop_last: drop the tail instead of padding (see above).
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
        self._resume_at = 0  # where the next pass starts (set by load_state_dict)
        self._consumed = 0  # samples of this epoch handed to the training loop

    def __len__(self) -> int:
        """Indices per rank and epoch (a resumed pass yields fewer: the rest of the epoch)."""
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use the order of this epoch for the next pass (a new epoch forgets any resume
        point; setting the epoch a resume point belongs to keeps it)."""
        if epoch != self.epoch:
            self.epoch, self._resume_at, self._consumed = epoch, 0, 0

    def advance(self, n: int) -> None:
        """Record that the training loop has taken ``n`` more samples of this epoch.

        Raises:
            ConfigError: ``n`` is negative or would pass the end of the rank's share.
        """
        if n < 0 or self._consumed + n > self.num_samples:
            raise ConfigError(
                f"advance({n}) after {self._consumed} consumed samples would pass the end of "
                f"this rank's {self.num_samples} samples per epoch"
            )
        self._consumed += n

    def __iter__(self) -> Iterator[int]:
        start, self._resume_at = self._resume_at, 0
        self._consumed = start
        return self._indices(start)

    def _indices(self, start: int) -> Iterator[int]:
        n, world = self.dataset_len, self.world_size
        perm = IndexPermutation(n, self.seed, self.epoch) if self.shuffle and n else None
        for lo in range(start, self.num_samples, _CHUNK):
            hi = min(lo + _CHUNK, self.num_samples)
            positions = (np.arange(lo, hi, dtype=np.int64) * world + self.rank) % n
            yield from (positions if perm is None else perm.map(positions)).tolist()

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able record of the epoch and the samples consumed on this rank."""
        setup = self._setup()
        return {
            "kind": STATE_KIND,
            "version": 1,
            **setup,
            "epoch": self.epoch,
            "consumed": self._consumed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass yields the rest of its epoch.

        Raises:
            ConfigError: the state belongs to another dataset length, seed, shuffle,
                drop_last or world size.
        """
        check_state(state, STATE_KIND, self._setup())
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.num_samples:
            raise ConfigError(f"the state's consumed={consumed} is outside this rank's share")
        self.epoch, self._resume_at, self._consumed = int(state["epoch"]), consumed, consumed

    def _setup(self) -> dict[str, Any]:
        return {
            "dataset_len": self.dataset_len,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
        }
