"""Batches packed in place and passed through reused shared memory (shardex.torch.collate).

Every loader here is a real DataLoader with real worker processes; what is compared is
what a training loop sees: the batches of ``default_collate``, and that no batch it holds
changes under it.
"""

from __future__ import annotations

import gc
import resource
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from helpers import shm_entries, shm_left_behind, small_export  # noqa: E402
from shardex.errors import ConfigError  # noqa: E402
from shardex.torch import (  # noqa: E402
    MapDataset,
    RowPacker,
    ShardexSampler,
    StreamDataset,
    batches,
    collate,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N = 23
SHARD = 4


class Items(Dataset[Any]):
    """Items of every kind default_collate handles, different per index."""

    def __init__(self, n: int, *, packed: bool = False, ragged: bool = False) -> None:
        self.n, self.packed, self.ragged = n, packed, ragged

    def __len__(self) -> int:
        return self.n

    def item(self, i: int) -> dict[str, Any]:
        side = 3 + (i % 2 if self.ragged else 0)
        return {
            "image": torch.full((side, 4, 3), i % 251, dtype=torch.uint8),
            "embedding": np.arange(5, dtype=np.float32) * i,
            "label": i,
            "score": i / 7,
            "flag": i % 3 == 0,
            "key": f"k{i:03d}",
            "pair": (torch.tensor([i, -i], dtype=torch.int16), f"p{i}"),
        }

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.item(i)

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        if not self.packed:
            return [self.item(i) for i in indices]
        packer = RowPacker(len(indices))
        return [packer.pack(self.item(i)) for i in indices]


def assert_same(got: Any, expected: Any) -> None:
    assert type(got) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        assert torch.equal(got, expected)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for k in expected:
            assert_same(got[k], expected[k])
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert_same(g, e)
    else:
        assert got == expected


def _loaders(workers: int, packed: bool, **kw: Any) -> tuple[DataLoader[Any], DataLoader[Any]]:
    ours = DataLoader(
        Items(N, packed=packed), batch_size=4, num_workers=workers, collate_fn=collate, **kw
    )
    plain = DataLoader(Items(N), batch_size=4, num_workers=0)
    return ours, plain


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_equal_default_collate(workers: int, packed: bool) -> None:
    ours, plain = _loaders(workers, packed)
    for _ in range(2):  # a second pass: new workers, new buffers
        for got, expected in zip(ours, plain, strict=True):
            assert_same(got, expected)


def test_spawned_workers_give_the_same_batches() -> None:
    ours, plain = _loaders(2, True, multiprocessing_context="spawn")
    for got, expected in zip(ours, plain, strict=True):
        assert_same(got, expected)


def test_workers_reuse_a_few_buffers_for_many_batches() -> None:
    loader = DataLoader(Items(400, packed=True), batch_size=4, num_workers=1, collate_fn=collate)
    seen = sum(1 for _ in loader)
    assert seen == 100
    mapped = [len(ids) for ids in batches._MAPPED.values()]
    # 6 tensor fields per batch, a few batches in flight: far fewer buffers than batches
    assert mapped
    assert max(mapped) <= 6 * 5, mapped


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_the_loop_keeps_are_never_overwritten(workers: int) -> None:
    loader = DataLoader(
        Items(400, packed=True), batch_size=4, num_workers=workers, collate_fn=collate
    )
    kept, rows = [], []
    for i, batch in enumerate(loader):
        if i % 2:
            kept.append(batch)  # the whole batch
        else:
            rows.append(batch["image"][1])  # only a view of one row: the buffer stays busy
    plain = list(DataLoader(Items(400), batch_size=4))
    for i, expected in enumerate(plain):
        if i % 2:
            assert_same(kept[i // 2], expected)
        else:
            assert torch.equal(rows[i // 2], expected["image"][1])


def test_the_main_process_keeps_few_free_blocks() -> None:
    loader = DataLoader(Items(200, packed=True), batch_size=4, collate_fn=collate)
    kept = list(loader)  # 50 batches held at once: more than the pool may hold
    assert len(kept) == 50
    del kept
    gc.collect()
    pool = batches._local_pool()
    assert pool.busy == 0
    assert len(pool.free) <= batches.KEEP_FREE


def test_a_batch_may_be_changed_in_place_by_the_loop() -> None:
    loader = DataLoader(Items(200, packed=True), batch_size=4, num_workers=1, collate_fn=collate)
    plain = DataLoader(Items(200), batch_size=4)
    for batch, expected in zip(loader, plain, strict=True):
        assert_same(batch, expected)  # later batches reuse the buffers zeroed below
        batch["image"].zero_()
        batch["label"].fill_(-1)
    # 50 batches of 6 tensor fields in at most 5 batches' buffers: zeroed ones were reused
    assert max(len(ids) for ids in batches._MAPPED.values()) <= 6 * 5


def trimmed(batch: list[Any]) -> Any:
    """A collate_fn of a user's: shardex's, then a view computed in the worker."""
    out = collate(batch)
    out["image"] = out["image"][1:, :2]
    return out


def test_tensors_computed_from_a_batch_in_the_worker_arrive_intact() -> None:
    ours = DataLoader(Items(N, packed=True), batch_size=4, num_workers=2, collate_fn=trimmed)
    for got, expected in zip(ours, DataLoader(Items(N), batch_size=4), strict=True):
        assert torch.equal(got["image"], expected["image"][1:, :2])
        assert torch.equal(got["label"], expected["label"])


def test_unequal_shapes_fail_in_one_line_naming_the_field() -> None:
    """default_collate's error names no field and comes as a long traceback; collate's
    says which field differs, two of its shapes, and what to do."""
    items = Items(8, packed=True, ragged=True)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        next(iter(DataLoader(Items(8, ragged=True), batch_size=4)))
    for workers in (0, 2):
        loader = DataLoader(items, batch_size=4, num_workers=workers, collate_fn=collate)
        with pytest.raises(ConfigError, match=r"cannot batch the field '\w+': its items differ"):
            next(iter(loader))


def test_no_shared_memory_is_left_behind() -> None:
    before = shm_entries()
    loader = DataLoader(Items(200, packed=True), batch_size=4, num_workers=2, collate_fn=collate)
    assert sum(len(b["key"]) for b in loader) == 200
    del loader
    gc.collect()
    # (a DataLoader of another test running beside this one maps its own: not counted)
    left = shm_left_behind(before)
    assert not {name for name in left if "torch" in name or "shardex" in name}


class HeapChurn(Dataset[Any]):
    """Each item: the page faults of taking 40 MB of heap again just after freeing it."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        chunks = [bytearray(200_000) for _ in range(200)]  # every page written
        del chunks
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        again = [bytearray(200_000) for _ in range(200)]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del again
        return torch.tensor(faults)


def test_workers_reuse_freed_heap_without_faulting_it_in_again() -> None:
    if not batches.glibc():
        pytest.skip("the C library is not glibc")

    def faults(collate_fn: Any) -> int:
        # Spawned: a fresh interpreter has glibc's default thresholds, whatever this one's.
        loader = DataLoader(
            HeapChurn(), num_workers=1, multiprocessing_context="spawn", collate_fn=collate_fn
        )
        return int(list(loader)[1])  # the second item: after the first batch's collate

    pages = 40_000_000 // 4096
    # torch's collate: the heap was given back and refaulted (a quarter at least: 45% in
    # one loaded run, where glibc kept part of it; shardex's collate stays under 5%)
    assert faults(None) > pages // 4
    assert faults(collate) < pages // 20


# -- the shardex datasets' own loaders ---------------------------------------------------


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_export(tmp_path_factory.mktemp("batches"), N, SHARD)


def square(pixels: np.ndarray[Any, Any]) -> Any:
    return torch.from_numpy(np.ascontiguousarray(pixels[:6, :6, :3]))


@pytest.mark.parametrize("workers", [0, 2])
def test_map_dataloader_batches_equal_a_plain_dataloaders(export: Path, workers: int) -> None:
    ds = MapDataset(export, transform=square, keys=("label",))
    ours = ds.dataloader(5, sampler=ShardexSampler(len(ds), seed=3), num_workers=workers)
    plain = DataLoader(ds, 5, sampler=ShardexSampler(len(ds), seed=3))
    assert isinstance(ours.sampler, ShardexSampler)
    for got, expected in zip(ours, plain, strict=True):
        assert_same(got, expected)
    assert ds._pack is False  # the user's dataset is left as it was


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_dataloader_batches_equal_a_plain_dataloaders(export: Path, workers: int) -> None:
    stream = StreamDataset(export, transform=square, seed=4, buffer_size=3)
    expected = list(DataLoader(stream, 5))  # num_workers=0: the same order as 1 worker
    got = list(stream.dataloader(5, num_workers=min(workers, 1)))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_same(g, e)
    if workers:
        keys = [k for b in stream.dataloader(5, num_workers=workers) for k in b["__key__"]]
        assert sorted(keys) == sorted(k for b in expected for k in b["__key__"])


def test_map_dataloader_without_batching_or_with_a_batch_sampler(export: Path) -> None:
    from torch.utils.data import BatchSampler

    ds = MapDataset(export, transform=square)
    sampler = ShardexSampler(len(ds), seed=5)
    singles = list(ds.dataloader(None, sampler=sampler))  # items as the dataset makes them
    assert [s["__key__"] for s in singles] == [ds[i]["__key__"] for i in sampler]
    assert all(
        torch.equal(s["image"], ds[i]["image"]) for s, i in zip(singles, sampler, strict=True)
    )
    batcher = BatchSampler(sampler, 6, drop_last=True)
    batches_ = list(ds.dataloader(batch_sampler=batcher, num_workers=2))
    assert [len(b["__key__"]) for b in batches_] == [6] * (N // 6)
    for b, indices in zip(batches_, batcher, strict=True):
        assert torch.equal(b["image"], torch.stack([ds[i]["image"] for i in indices]))
