"""A map-style PyTorch dataset over an export: one read per sample."""

from __future__ import annotations

import contextlib
import copy
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from shardex.storage import Storage
from shardex.torch.batches import RowPacker, collate
from shardex.torch.handle import DatasetHandle
from shardex.torch.sampler import ShardexSampler
from shardex.torch.samples import SampleMaker, SampleSpec, Transform


class MapDataset(Dataset[Any]):
    """True random access for PyTorch: ``ds[i]`` is one read, a batch one
    :meth:`~shardex.Dataset.get_many`. Pair it with :class:`~shardex.torch.ShardexSampler`.
    The split opens lazily in each process, so it pickles small for any start method.

    Args:
        uri, split: the export's folder, URL or Storage, and its split (optional if one).
        decode: True: items are ``{"__key__", "image", "label", *keys}`` (image an
            (H, W, C) uint8 tensor, or ``transform(pixels)``); False: the raw sample plus
            ``keys`` (passed to ``transform`` if given).
        transform: see ``decode``; must pickle for spawned workers.
        decode_size: ``(width, height)`` that ``transform`` resizes to, so JPEGs decode
            at a reduced scale that stays at least that large.
        keys: metadata columns to add to each item; ``label`` replaces the ``cls`` label.
        storage_options, verify: object storage options; check each sample's checksum.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str] | Storage,
        split: str | None = None,
        *,
        decode: bool = True,
        transform: Transform | None = None,
        decode_size: tuple[int, int] | None = None,
        keys: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        verify: bool = True,
    ) -> None:
        self._handle = DatasetHandle(uri, split, storage_options=storage_options, verify=verify)
        spec = SampleSpec(
            decode=decode, transform=transform, keys=tuple(keys or ()), decode_size=decode_size
        )
        self._make = SampleMaker(spec, self._handle)
        # The sample as read is already a fresh dict: skip SampleMaker (~5 % of a read).
        self._plain = not decode and not spec.keys and transform is None
        self._pack = False  # the copy a dataloader() reads packs each batch's rows
        # (pid, indices, finish) of the batch this process reads next, already requested
        self._ahead: tuple[int, list[int], Callable[[], list[Any]]] | None = None
        self._guess = True

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ahead": None}

    def __len__(self) -> int:
        return len(self._handle)

    def __getitem__(self, index: int) -> Any:
        if self._plain:
            return self._handle.dataset()[index]
        if index < 0:
            index += len(self._handle)
        return self._make(self._handle.dataset()[index], index)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch as one batched read."""
        n = len(self._handle)
        wanted = [i + n if i < 0 else i for i in indices]
        ds, ahead, self._ahead = self._handle.dataset(), self._ahead, None
        if ahead is not None and ahead[0] == os.getpid() and ahead[1] == wanted:
            finish = ahead[2]
        else:
            if ahead is not None and ahead[0] == os.getpid():  # batches go out another way
                self._guess = False  # (``in_order=False``): no more reads wasted on guesses
            finish = ds.start_many(wanted)
        nxt = getattr(indices, "ahead", None)
        if nxt and self._guess:  # the batch this worker reads next: sent while this one is made
            nxt = [i + n if i < 0 else i for i in nxt]
            with contextlib.suppress(Exception):  # raised again when that batch is asked
                self._ahead = (os.getpid(), nxt, ds.start_many(nxt))
        raws = finish()
        make = self._make
        if not self._pack:
            return [make(raw, i) for raw, i in zip(raws, wanted, strict=True)]
        packer = RowPacker(len(wanted))
        return [packer.pack(make(raw, i)) for raw, i in zip(raws, wanted, strict=True)]

    def dataloader(
        self,
        batch_size: int | None = 1,
        *,
        sampler: Iterable[int] | None = None,
        num_workers: int = 0,
        **kwargs: Any,
    ) -> DataLoader[Any]:
        """A DataLoader over this dataset, by default with ``ShardexSampler(len(self))``.

        Without a ``collate_fn`` it is :func:`shardex.torch.collate`, and
        ``loader.dataset`` a copy that packs rows."""
        reader = copy.copy(self)
        reader._ahead = None
        batched = batch_size is not None or kwargs.get("batch_sampler") is not None
        reader._pack = batched and kwargs.get("collate_fn") is None
        if reader._pack:
            kwargs["collate_fn"] = collate
        batches = kwargs.pop("batch_sampler", None)  # it replaces batch_size and sampler
        if batches is None:
            sampler = ShardexSampler(len(self)) if sampler is None else sampler
            if not batched:
                return DataLoader(
                    reader, batch_size=None, sampler=sampler, num_workers=num_workers, **kwargs
                )
            drop_last = kwargs.pop("drop_last", False)
            batches = BatchSampler(sampler, batch_size, drop_last)  # type: ignore[arg-type]
        lookahead = Lookahead(batches, max(num_workers, 1))
        loader = DataLoader(reader, batch_sampler=lookahead, num_workers=num_workers, **kwargs)
        # loader.sampler as without a batch sampler (DataLoader forbids setting it)
        if getattr(batches, "sampler", None) is not None:
            object.__setattr__(loader, "sampler", batches.sampler)
        return loader

    def __repr__(self) -> str:
        return f"MapDataset({self._handle.storage.uri!r}, split={self._handle.split!r})"


class _Batch(list[int]):
    """A batch's indices, with ``ahead``: those of the batch its worker gets next."""

    ahead: list[int] | None = None


class Lookahead(Sampler[list[int]]):
    """``batches``, each telling its reader the batch that reader gets next.

    A DataLoader hands batch ``b`` to worker ``b % workers``, so a worker's next batch is
    ``b + workers``: :class:`MapDataset` sends its requests while batch ``b`` is made
    (decoded, transformed, packed). A guess that turns out wrong costs one batch's reads,
    never a wrong sample: the dataset compares the indices asked with those it started.
    """

    def __init__(self, batches: Iterable[list[int]], workers: int) -> None:
        self.batches, self.workers = batches, workers

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        queue: deque[list[int]] = deque()
        for batch in self.batches:
            queue.append(batch)
            if len(queue) > self.workers:
                yield _ahead(queue.popleft(), batch)
        while queue:
            yield _ahead(queue.popleft(), None)


def _ahead(batch: list[int], ahead: list[int] | None) -> _Batch:
    out = _Batch(batch)
    out.ahead = None if ahead is None else list(ahead)
    return out
