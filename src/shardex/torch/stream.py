"""A streaming PyTorch dataset: shard order, bounded shuffle, exactly equal ranks, resume.

Each worker reads its piece of the rank's share (:mod:`shardex.torch.order`) in runs of
at most ``block_bytes``, one ahead, through a seeded shuffle buffer.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardex.dataset import Sample
from shardex.errors import ConfigError
from shardex.storage import Storage
from shardex.torch.batches import RowPacker, collate
from shardex.torch.blocks import DEFAULT_BLOCK_BYTES, blocks, read_blocks
from shardex.torch.delivery import deliver, deliverable
from shardex.torch.distributed import check_state, rank_share, resolve_ranks
from shardex.torch.handle import DatasetHandle
from shardex.torch.order import (
    EpochOrder,
    Segment,
    cut,
    merge,
    piece_sizes,
    plan_length,
    worker_piece,
)
from shardex.torch.permutation import derive_key
from shardex.torch.samples import SampleMaker, SampleSpec, Transform
from shardex.torch.shuffle import ShuffleBuffer, leftovers, replay

STATE_KIND: Final = "shardex.StreamDataset"
ITERATOR_KIND: Final = "shardex.StreamDataset.iterator"
#: The settings a state records besides ``num_samples``, and must match when loaded.
_SETUP: Final = ("world_size", "rank", "shuffle", "seed", "buffer_size", "drop_last")


@dataclass(frozen=True, slots=True)
class _Start:
    """Where a pass over an epoch starts: the rank's plan and each worker's position."""

    plan: tuple[Segment, ...]
    generation: int  # times the plan was remade for another number of workers
    given: tuple[int, ...]  # samples each worker (by role) has given out; () = none
    rotation: int  # the role of DataLoader worker 0 (whose batch comes next)


@dataclass(frozen=True, slots=True)
class _Geometry:
    workers: int
    batch_size: int
    drop_last: bool


class StreamDataset(IterableDataset[Any]):
    """Streams a split in shard order with a seeded shard shuffle and a bounded buffer
    shuffle, every rank yielding exactly ``len(ds)`` samples (padded by wrapping around).

    Call :meth:`set_epoch` before each epoch. To resume, save and load a ``torchdata``
    ``StatefulDataLoader``'s state (same ``num_workers``), or iterate :meth:`dataloader`,
    call :meth:`advance` per batch and save :meth:`state_dict` (one per rank). After
    :meth:`load_state_dict` the next pass yields exactly the rest of the epoch: in the
    uninterrupted order with the same workers and batch size, re-cut among the workers
    otherwise. A plain DataLoader with workers iterates correctly but has no state.

    Args:
        uri, split, decode, transform, decode_size, keys, storage_options, verify: as for
            :class:`~shardex.torch.MapDataset`.
        shuffle, seed: shuffle shards and mix samples in a buffer, seeded alike on all ranks.
        buffer_size: samples held by each worker's shuffle buffer.
        rank, world_size: default torch.distributed's, else 0 of 1.
        drop_last: give every rank ``N // world_size`` samples instead of padding.
        block_bytes: the most bytes read with one request (and held twice per worker).
    """

    def __init__(
        self,
        uri: str | os.PathLike[str] | Storage,
        split: str | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        buffer_size: int = 1000,
        decode: bool = True,
        transform: Transform | None = None,
        decode_size: tuple[int, int] | None = None,
        keys: Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        storage_options: dict[str, Any] | None = None,
        verify: bool = True,
    ) -> None:
        if buffer_size < 0 or block_bytes < 1:
            raise ConfigError(
                f"buffer_size must be >= 0 and block_bytes >= 1 "
                f"(got {buffer_size} and {block_bytes})"
            )
        self._handle = DatasetHandle(uri, split, storage_options=storage_options, verify=verify)
        spec = SampleSpec(
            decode=decode, transform=transform, keys=tuple(keys or ()), decode_size=decode_size
        )
        self._make = SampleMaker(spec, self._handle)
        self.rank, self.world_size = resolve_ranks(rank, world_size)
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.buffer_size = buffer_size if shuffle else 0
        self.block_bytes = block_bytes
        self.epoch = 0
        self._epoch_set: int | None = None  # the epoch last given to set_epoch()
        self._pending: _Start | None = None  # from load_state_dict, for the next pass
        self._pass: _Start | None = None  # where the current pass started
        self._armed = False  # a StreamLoader has started a pass its workers will read
        self._geometry: _Geometry | None = None
        self._pack_rows = 0  # a StreamLoader's batch size, while its pass starts: pack rows
        self._consumed = 0  # samples of the current pass handed to the training loop

    def __len__(self) -> int:
        """Samples this rank yields per epoch (a resumed pass yields the rest of it)."""
        return rank_share(len(self._handle), self.world_size, drop_last=self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's order for the next pass (a new epoch forgets a resume point)."""
        self._epoch_set = epoch
        if epoch != self.epoch:
            self.epoch, self._pending, self._pass, self._consumed = epoch, None, None, 0

    def advance(self, n: int) -> None:
        """Record that the training loop has taken ``n`` more samples (one whole batch)."""
        if n < 0:
            raise ConfigError(f"advance() takes a number of samples >= 0, got {n}")
        self._consumed += n

    def dataloader(
        self, batch_size: int | None = 1, *, num_workers: int = 0, **kwargs: Any
    ) -> StreamLoader:
        """A DataLoader over this dataset that can report and restore its state; the
        default ``collate_fn`` is :func:`shardex.torch.collate`, items packed into rows."""
        return StreamLoader(self, batch_size=batch_size, num_workers=num_workers, **kwargs)

    def _fresh(self) -> _Start:
        share = len(self)
        return _Start(((self.rank * share, (self.rank + 1) * share),), 0, (), 0)

    def _key(self, role: int, generation: int) -> int:
        return derive_key(self.seed, self.epoch, self.rank, role, generation)

    def _begin_pass(self, workers: int) -> _Start:
        start, self._pending = self._pending or self._fresh(), None
        if len(start.given) != workers:
            if any(start.given):
                start = self._replan(start)
            start = _Start(start.plan, start.generation, (0,) * workers, 0)
        self._pass, self._consumed = start, 0
        return start

    def _replan(self, start: _Start) -> _Start:
        """The rest of an epoch left by ``len(start.given)`` workers, as a new plan."""
        old = len(start.given)
        rest: list[Segment] = []
        for role, given in enumerate(start.given):
            piece = worker_piece(start.plan, old, role)
            rest += leftovers(piece, self.buffer_size, self._key(role, start.generation), given)
        return _Start(tuple(merge(rest)), start.generation + 1, (), 0)

    def _setup(self) -> dict[str, Any]:
        return {"num_samples": len(self._handle), **{n: getattr(self, n) for n in _SETUP}}

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able record of how far this rank got in the current epoch (a ConfigError
        if samples came from workers of a loader not made by :meth:`dataloader`)."""
        start = self._pass or self._pending or self._fresh()
        given, rotation = list(start.given), start.rotation
        if self._consumed:
            given, rotation = self._progress(self._pass)
        return {
            "kind": STATE_KIND,
            "version": 1,
            **self._setup(),
            "epoch": self.epoch,
            "plan": [list(s) for s in start.plan],
            "generation": start.generation,
            "given": given,
            "rotation": rotation,
        }

    def _progress(self, start: _Start | None) -> tuple[list[int], int]:
        # A pass the main process did not begin ran in the workers of a plain DataLoader.
        workers = 0 if start is None else len(start.given)
        geometry = _Geometry(1, 1, False) if workers == 1 else self._geometry
        if start is None or geometry is None or geometry.workers != workers:
            raise ConfigError(
                "cannot tell how far each DataLoader worker got: make the loader with "
                "StreamDataset.dataloader(...) to save and restore a streaming state"
            )
        sizes = piece_sizes(plan_length(start.plan), workers)
        roles = [(i + start.rotation) % workers for i in range(workers)]
        remaining = [sizes[r] - start.given[r] for r in roles]
        total = sum(deliverable(r, geometry.batch_size, geometry.drop_last) for r in remaining)
        if self._consumed > total:
            raise ConfigError(
                f"advance() recorded {self._consumed} samples but this pass yields {total}"
            )
        taken, next_id = deliver(self._consumed, remaining, geometry.batch_size, geometry.drop_last)
        given = list(start.given)
        for i, role in enumerate(roles):
            given[role] += taken[i]
        return given, roles[next_id]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next pass yields the rest of its epoch
        (a ConfigError if it was saved with other settings or for another split)."""
        check_state(state, STATE_KIND, self._setup())
        plan = tuple((int(a), int(b)) for a, b in state["plan"])
        given = tuple(int(g) for g in state["given"])
        self.epoch = int(state["epoch"])
        self._pending = _Start(plan, int(state["generation"]), given, int(state["rotation"]))
        self._pass, self._consumed = None, 0

    def __iter__(self) -> StreamIterator:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        # A StreamLoader began the pass before forking; a plain DataLoader's workers begin theirs.
        start = self._pass if self._armed else None
        if start is None or len(start.given) != workers:
            start = self._begin_pass(workers)
        if info is None:
            self._armed = False
        return StreamIterator(self, start, workers, worker)

    def _samples(self, piece: list[Segment], key: int, given: int) -> Generator[Any, None, None]:
        ds = self._handle.shards()
        info = ds.config.split(ds.split)
        order = EpochOrder.make(
            [s.num_samples for s in info.shards],
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
        )
        held, taken = replay(piece, self.buffer_size, key, given)
        buffer = ShuffleBuffer[tuple[int, Sample]](self.buffer_size, key, step=given)
        if held:  # the samples the buffer held at the resume point: read them again
            numbers = order.sample_numbers(held)
            buffer.items = list(zip(numbers, ds.get_many(numbers), strict=True))
        make = self._make
        rest = cut(piece, taken, plan_length(piece))
        for item in read_blocks(ds, blocks(ds, order, rest, self.block_bytes)):
            out = buffer.push(item)
            if out is not None:
                yield make(out[1], out[0])
        while buffer.items:
            number, raw = buffer.pop()
            yield make(raw, number)


class StreamIterator(Iterator[Any]):
    """One worker's pass over its piece of a :class:`StreamDataset`, counting what it gave:
    ``StatefulDataLoader`` saves the count per batch, so no ``advance`` calls are needed."""

    def __init__(self, dataset: StreamDataset, start: _Start, workers: int, worker: int) -> None:
        self.dataset, self.workers, self.worker = dataset, workers, worker
        self._seek(start)

    def _seek(self, start: _Start) -> None:
        ds = self.dataset
        self.role = (self.worker + start.rotation) % self.workers
        self.epoch, self.generation = ds.epoch, start.generation
        self.given = start.given[self.role]
        self._piece = worker_piece(start.plan, self.workers, self.role)
        self._key = ds._key(self.role, start.generation)
        self._items: Generator[Any, None, None] | None = None  # made on the first next()
        # Batches start afresh at every (re)start: a loader takes whole batches from here.
        self._packer = RowPacker(ds._pack_rows) if ds._pack_rows else None

    def __iter__(self) -> StreamIterator:
        return self

    def __next__(self) -> Any:
        if self._items is None:
            self._items = self.dataset._samples(self._piece, self._key, self.given)
        item = next(self._items)
        self.given += 1
        return item if self._packer is None else self._packer.pack(item)

    def _pass_id(self) -> dict[str, int]:
        return {"epoch": self.epoch, "generation": self.generation, "role": self.role}

    def state_dict(self) -> dict[str, Any]:
        """``{"kind", "epoch", "generation", "role", "given"}``: this worker's position."""
        return {"kind": ITERATOR_KIND, **self._pass_id(), "given": self.given}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved position of the dataset's loaded pass, unless ``set_epoch``
        chose another epoch (StatefulDataLoader loads state after the loop's ``set_epoch``):
        then that epoch from its start. A ConfigError for another pass's or worker's state."""
        check_state(state, ITERATOR_KIND, {})
        ds = self.dataset
        if self._items is not None:
            self._items.close()
        chosen = ds._epoch_set
        if chosen is not None and chosen != state.get("epoch"):
            ds.epoch, ds._pending = chosen, None
            self._seek(ds._begin_pass(self.workers))
            return
        check_state(state, ITERATOR_KIND, self._pass_id())
        given = int(state["given"])
        if not 0 <= given <= plan_length(self._piece):
            raise ConfigError(f"the state's given={given} is outside this worker's piece")
        self.given, self._items = given, None
        if self._packer is not None:
            self._packer = RowPacker(self._packer.rows)


class StreamLoader(DataLoader[Any]):
    """A DataLoader that tells its :class:`StreamDataset` its workers and batch size, so
    :meth:`~StreamDataset.state_dict` knows how far each worker got."""

    dataset: StreamDataset

    def __init__(self, dataset: StreamDataset, **kwargs: Any) -> None:
        if kwargs.get("persistent_workers"):
            raise ConfigError(
                "persistent_workers would keep each worker's copy of the dataset from one "
                "epoch to the next, so set_epoch() and load_state_dict() would not reach it"
            )
        self._packs = kwargs.get("collate_fn") is None and kwargs.get("batch_size", 1) is not None
        if self._packs:
            kwargs["collate_fn"] = collate
        super().__init__(dataset, **kwargs)

    def __iter__(self) -> Any:
        ds = self.dataset
        workers = max(1, self.num_workers)
        ds._geometry = _Geometry(workers, self.batch_size or 1, self.drop_last)
        ds._begin_pass(workers)
        ds._armed = True
        ds._pack_rows = (self.batch_size or 1) if self._packs else 0
        try:
            return super().__iter__()
        finally:
            ds._armed, ds._pack_rows = False, 0

    def __len__(self) -> int:
        """Batches per epoch, counting each worker's short last batch."""
        workers, size = max(1, self.num_workers), self.batch_size or 1
        return sum(
            -(-deliverable(n, size, self.drop_last) // size)
            for n in piece_sizes(len(self.dataset), workers)
        )
