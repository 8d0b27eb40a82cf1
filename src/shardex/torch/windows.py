"""``TensorShardsLoader``: batches from prefetched windows of whole shards (backends with
``capabilities.shard_windows``). Each rank takes an equal contiguous share of the seeded
shard sequence, cut into windows shuffled within; a batch may span two windows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import torch
from shardex.api import open_dataset
from shardex.backends.columns import ColumnReader, concat_columns, slice_columns
from shardex.backends.registry import backend_for
from shardex.bfloat16 import is_bfloat16
from shardex.dataset import ShardWindows
from shardex.errors import ConfigError
from shardex.fields import is_fixed
from shardex.torch.distributed import resolve_ranks
from shardex.torch.order import EpochOrder
from shardex.torch.permutation import derive_key

_SAMPLE_SALT = 0x77D0
_Loaded = tuple[ColumnReader, npt.NDArray[np.int64]]  # a window's columns and read order
#: Settings that define the epoch's batches: a saved state only fits the same ones.
_ORDER_SETTINGS = (
    "seed",
    "batch_size",
    "world_size",
    "shards_per_window",
    "shuffle_shards",
    "shuffle_samples",
    "drop_last",
)


@dataclass(frozen=True, slots=True)
class _Window:
    """Shard pieces ``(shard, first local sample, count)`` read and shuffled together."""

    pieces: tuple[tuple[int, int, int], ...]

    @property
    def size(self) -> int:
        return sum(p[2] for p in self.pieces)


class TensorShardsLoader:
    """Batches of whole-shard windows with prefetch, exact rank shares and resume.

    Args:
        uri: a ``tensor_shards`` (or ``torch``) export.
        shards_per_window, prefetch_windows, prefetch_workers: shard pieces loaded and
            shuffled together, windows loaded ahead, and the threads loading them.
        shuffle_shards, shuffle_samples: seeded shard order, and sample order within each
            window, new each epoch.
        pin_memory: pin batch tensors (when CUDA is available).
        seed: each epoch derives its own orders from it (``set_epoch``).
        rank, world_size: default torch.distributed's, else 0 of 1.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        batch_size: int,
        *,
        split: str = "train",
        shards_per_window: int = 6,
        prefetch_windows: int = 2,
        prefetch_workers: int = 2,
        shuffle_shards: bool = True,
        shuffle_samples: bool = True,
        pin_memory: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1 or shards_per_window < 1 or prefetch_workers < 1:
            raise ConfigError("batch_size, shards_per_window and prefetch_workers must be >= 1")
        dataset = open_dataset(uri, split=split, storage_options=storage_options)
        backend = dataset.config.backend
        if not backend_for(dataset.config).capabilities.shard_windows:
            raise ConfigError(
                "TensorShardsLoader reads whole shards of arrays (backends whose "
                f"capabilities declare shard_windows); {os.fspath(uri)} is a {backend!r} "
                "export, whose backend does not: use shardex.torch.StreamDataset or MapDataset"
            )
        if not isinstance(dataset, ShardWindows):
            raise ConfigError(
                f"backend {backend!r} declares shard_windows, but its dataset "
                f"{type(dataset).__name__} is not a shardex.dataset.ShardWindows (it must "
                "implement shard_sizes and shard_columns); fix the backend, or read "
                f"{os.fspath(uri)} with shardex.torch.StreamDataset or MapDataset"
            )
        if prefetch_windows < 0:
            raise ConfigError(f"prefetch_windows must be >= 0, got {prefetch_windows}")
        self.rank, self.world_size = resolve_ranks(rank, world_size)
        self.dataset: ShardWindows = dataset
        self.batch_size, self.drop_last, self.pin_memory = batch_size, drop_last, pin_memory
        self.shards_per_window, self.prefetch_windows = shards_per_window, prefetch_windows
        self.prefetch_workers = prefetch_workers
        self.shuffle_shards, self.shuffle_samples, self.seed = shuffle_shards, shuffle_samples, seed
        self.epoch = 0
        self._batches = 0  # batches of this epoch delivered

    def _windows(self) -> list[_Window]:
        sizes, shuffle = self.dataset.shard_sizes, self.shuffle_shards
        order = EpochOrder.make(sizes, shuffle=shuffle, seed=self.seed, epoch=self.epoch)
        share = order.num_samples // self.world_size
        start = self.rank * share
        first = [int(f) for f in order.first]
        pieces = [
            (shard, sample - first[shard], count)
            for shard, sample, count in order.runs(start, start + share)
        ]
        step = self.shards_per_window
        return [_Window(tuple(pieces[i : i + step])) for i in range(0, len(pieces), step)]

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        share = self.dataset.config.split(self.dataset.split).num_samples // self.world_size
        full, rest = divmod(share, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _load(self, window: _Window, number: int) -> _Loaded:
        """A window's columns, and the order its samples are read in."""
        parts = [
            slice_columns(self.dataset.shard_columns(shard), start, count)
            for shard, start, count in window.pieces
        ]
        joined = ColumnReader(self.dataset.layout, concat_columns(parts))
        order = np.arange(window.size, dtype=np.int64)
        if self.shuffle_samples:
            key = derive_key(self.seed, _SAMPLE_SALT, self.epoch, number)
            order = np.random.default_rng(key).permutation(window.size)
        return joined, order

    def __iter__(self) -> Iterator[dict[str, Any]]:
        windows = self._windows()
        skip = self._batches * self.batch_size
        at, first = 0, 0
        while first < len(windows) and at + windows[first].size <= skip:
            at += windows[first].size
            first += 1
        carry: list[_Loaded] = []
        offset = skip - at
        with ThreadPoolExecutor(self.prefetch_workers, thread_name_prefix="shardex-window") as pool:
            futures: list[Future[_Loaded]] = [
                pool.submit(self._load, windows[w], w)
                for w in range(first, min(first + 1 + self.prefetch_windows, len(windows)))
            ]
            next_window = first + len(futures)
            while futures:
                reader, order = futures.pop(0).result()
                if next_window < len(windows):
                    futures.append(pool.submit(self._load, windows[next_window], next_window))
                    next_window += 1
                carry.append((reader, order[offset:]))
                offset = 0
                yield from self._emit(carry, final=not futures)
        self.epoch, self._batches = self.epoch + 1, 0

    def _emit(self, carry: list[_Loaded], final: bool) -> Iterator[dict[str, Any]]:
        """Batches from the loaded samples not yet batched (``carry``, consumed in place)."""
        while True:
            available = sum(len(o) for _, o in carry)
            if available == 0 or (available < self.batch_size and not final):
                return
            if available < self.batch_size and self.drop_last:
                carry.clear()
                return
            take, parts = min(self.batch_size, available), []
            while take:
                reader, order = carry[0]
                n = min(take, len(order))
                parts.append((reader, order[:n]))
                take -= n
                if n == len(order):
                    carry.pop(0)
                else:
                    carry[0] = (reader, order[n:])
            batch = self._collate(parts)
            self._batches += 1
            yield batch

    def _collate(self, parts: list[_Loaded]) -> dict[str, Any]:
        out: dict[str, Any] = {"__key__": [r.key(int(i)) for r, rows in parts for i in rows]}
        for spec in self.dataset.layout:
            if is_fixed(spec) and not spec.optional:
                stacked = np.concatenate(
                    [np.asarray(r.columns[spec.column])[rows] for r, rows in parts]
                )
                tensor = torch.from_numpy(stacked)
                if is_bfloat16(spec):  # bit patterns: numpy has no bfloat16
                    tensor = tensor.view(torch.int16).view(torch.bfloat16)
                pin = self.pin_memory and torch.cuda.is_available()
                out[spec.name] = tensor.pin_memory() if pin else tensor
            else:
                out[spec.name] = [
                    r.native(int(i)).get(spec.name) for r, rows in parts for i in rows
                ]
        return out

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's orders for the next pass (a new epoch forgets a resume point);
        a full pass moves to the next epoch by itself."""
        if epoch != self.epoch:
            self.epoch, self._batches = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: epoch and batches delivered (JSON-serialisable)."""
        return {
            "epoch": self.epoch,
            "batches": self._batches,
            **{name: getattr(self, name) for name in _ORDER_SETTINGS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next batch is the one after it."""
        for name in _ORDER_SETTINGS:
            if state.get(name) != getattr(self, name):
                raise ConfigError(
                    f"the saved state has {name}={state[name]} but this loader has "
                    f"{getattr(self, name)}; resume with the same {name}"
                )
        self.epoch, self._batches = int(state["epoch"]), int(state["batches"])
