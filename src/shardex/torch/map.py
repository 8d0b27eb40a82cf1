"""A map-style PyTorch dataset over an export: one read per sample."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset

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
        raws = self._handle.dataset().get_many(wanted)
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
        batched = batch_size is not None or kwargs.get("batch_sampler") is not None
        reader._pack = batched and kwargs.get("collate_fn") is None
        if reader._pack:
            kwargs["collate_fn"] = collate
        if kwargs.get("batch_sampler") is not None:  # it replaces batch_size and sampler
            return DataLoader(reader, num_workers=num_workers, **kwargs)
        return DataLoader(
            reader,
            batch_size=batch_size,
            sampler=ShardexSampler(len(self)) if sampler is None else sampler,
            num_workers=num_workers,
            **kwargs,
        )

    def __repr__(self) -> str:
        return f"MapDataset({self._handle.storage.uri!r}, split={self._handle.split!r})"
