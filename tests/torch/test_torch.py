"""PyTorch loading: exact rank/worker shares, seeded shuffles, resume, fork/spawn, S3.

Every DataLoader here is a real ``torch.utils.data.DataLoader``; "ranks" are simulated by
passing ``rank``/``world_size``, except in the gloo test, which runs two real processes.
"""

from __future__ import annotations

import collections
import gc
import json
import pickle
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import shardex  # noqa: E402
from helpers import shm_entries, shm_left_behind, small_export  # noqa: E402
from shardex.codecs.images import decode  # noqa: E402
from shardex.errors import ConfigError  # noqa: E402
from shardex.storage.latency import LatencyStorage  # noqa: E402
from shardex.storage.memory import MemoryStorage  # noqa: E402
from shardex.torch import (  # noqa: E402
    IndexPermutation,
    MapDataset,
    ShardexSampler,
    StreamDataset,
    TensorShardsLoader,
)
from shardex.torch.map import Lookahead  # noqa: E402
from tests.support.s3data import S3Location  # noqa: E402

# torch advises against more workers than cores; CI machines may have a single core.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N = 23  # samples: odd, so two ranks need one padded sample
SHARD = 4  # samples per shard: 6 shards, the last one short
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_export(tmp_path_factory.mktemp("torch"), N, SHARD)


# Module-level functions, so that spawned workers and processes can unpickle them.


def keep(batch: list[Any]) -> list[Any]:
    """A collate_fn that keeps the samples as they are."""
    return batch


def crop(pixels: np.ndarray[Any, Any]) -> Any:
    """A transform giving equal-sized tensors, so that batches collate (through shm)."""
    return torch.from_numpy(np.ascontiguousarray(pixels[:8, :8, :3]))


def keys_of(loader: Iterable[list[dict[str, Any]]]) -> list[str]:
    return [sample["__key__"] for batch in loader for sample in batch]


def map_keys(uri: Path, *, rank: int, world: int, workers: int, epoch: int, **kw: Any) -> list[str]:
    ds = MapDataset(uri, decode=False)
    sampler = ShardexSampler(len(ds), rank=rank, world_size=world, **kw)
    sampler.set_epoch(epoch)
    return keys_of(
        DataLoader(ds, batch_size=3, sampler=sampler, num_workers=workers, collate_fn=keep)
    )


def stream_keys(
    uri: Path, *, rank: int, world: int, workers: int, epoch: int, **kw: Any
) -> list[str]:
    ds = StreamDataset(uri, decode=False, rank=rank, world_size=world, buffer_size=5, **kw)
    ds.set_epoch(epoch)
    loader = ds.dataloader(batch_size=3, num_workers=workers, collate_fn=keep)
    keys = keys_of(loader)
    assert len(keys) == len(ds)
    return keys


# -- the permutation ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 1000])
@pytest.mark.parametrize(("seed", "epoch"), [(0, 0), (7, 3), (-1, 2**40)])
def test_permutation_is_a_bijection(n: int, seed: int, epoch: int) -> None:
    perm = IndexPermutation(n, seed, epoch)
    order = [perm(i) for i in range(n)]
    assert sorted(order) == list(range(n))
    assert [perm.inverse(j) for j in order] == list(range(n))
    assert perm.map(np.arange(n)).tolist() == order == list(perm)
    assert perm.map(order, inverse=True).tolist() == list(range(n))
    with pytest.raises(IndexError):
        perm(n)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5000),
    seed=st.integers(-(2**63), 2**64),
    epoch=st.integers(0, 2**32),
)
def test_permutation_is_a_bijection_for_any_size(n: int, seed: int, epoch: int) -> None:
    out = IndexPermutation(n, seed, epoch).map(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))


def test_permutation_of_ten_million_is_a_bijection_in_constant_memory() -> None:
    n = 10**7
    perm = IndexPermutation(n, seed=11, epoch=4)
    assert len(pickle.dumps(perm)) < 1024  # a few keys, nothing of size n
    hit = np.zeros(n, dtype=bool)  # the check's memory, not the permutation's
    for start in range(0, n, 1 << 20):
        out = perm.map(np.arange(start, min(n, start + (1 << 20))))
        assert out.min() >= 0
        assert out.max() < n
        hit[out] = True
    assert hit.all()  # n images of n positions inside range(n), all hit: a bijection
    picks = np.random.default_rng(0).integers(0, n, 200).tolist()
    assert [perm(i) for i in picks] == perm.map(picks).tolist()
    assert [perm.inverse(perm(i)) for i in picks] == picks


def test_permutation_looks_uniformly_shuffled_and_changes_per_epoch() -> None:
    n = 1000
    orders = [IndexPermutation(n, seed=5, epoch=e).map(np.arange(n)) for e in range(4)]
    assert len({o.tobytes() for o in orders}) == 4
    assert np.array_equal(orders[0], IndexPermutation(n, seed=5).map(np.arange(n)))
    assert not np.array_equal(orders[0], IndexPermutation(n, seed=6).map(np.arange(n)))
    for order in orders:
        assert np.sum(order == np.arange(n)) < 8  # about one fixed point is expected
        assert np.sum(np.diff(order) == 1) < 8  # no runs kept in order
        assert abs(np.corrcoef(order, np.arange(n))[0, 1]) < 0.1
    # A small n: each value leads equally often, and every ordering of 5 occurs.
    firsts = collections.Counter()
    seen = set()
    for seed in range(3000):
        perm = IndexPermutation(5, seed=seed)
        firsts[perm(0)] += 1
        seen.add(tuple(perm))
    assert len(seen) == 120
    assert all(abs(c - 600) < 90 for c in firsts.values())


# -- the sampler ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 23, 24])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_gives_every_rank_exactly_equal_shares(n: int, world: int, drop_last: bool) -> None:
    shares = [
        list(ShardexSampler(n, rank=r, world_size=world, seed=3, drop_last=drop_last))
        for r in range(world)
    ]
    assert len({len(s) for s in shares}) == 1
    assert all(
        len(s) == len(ShardexSampler(n, rank=0, world_size=world, drop_last=drop_last))
        for s in shares
    )
    everything = collections.Counter(i for s in shares for i in s)
    perm = IndexPermutation(n, seed=3)
    if drop_last:
        assert sum(everything.values()) == n // world * world
        assert max(everything.values(), default=1) == 1
    else:
        pad = -n % world  # the first samples of the epoch's order, repeated
        repeated = collections.Counter(perm(p % n) for p in range(pad))
        assert everything == collections.Counter(range(n)) + repeated


def test_sampler_without_shuffle_and_its_state_checks() -> None:
    assert list(ShardexSampler(10, rank=1, world_size=3, shuffle=False)) == [1, 4, 7, 0]
    sampler = ShardexSampler(10, rank=0, world_size=2, seed=1)
    sampler.advance(5)
    with pytest.raises(ConfigError, match="pass the end"):
        sampler.advance(1)
    state = sampler.state_dict()
    assert json.loads(json.dumps(state)) == state
    with pytest.raises(ConfigError, match="world_size=2"):
        ShardexSampler(10, rank=0, world_size=4, seed=1).load_state_dict(state)
    with pytest.raises(ConfigError, match="seed"):
        ShardexSampler(10, rank=0, world_size=2, seed=2).load_state_dict(state)
    with pytest.raises(ConfigError, match="not in range"):
        ShardexSampler(10, rank=2, world_size=2)


# -- ranks x workers with real DataLoaders ----------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_sees_every_sample_once_per_epoch(export: Path, workers: int) -> None:
    ds = MapDataset(export, decode=False)
    all_keys = {ds[i]["__key__"] for i in range(N)}
    orders = []
    for epoch in range(3):
        ranks = [map_keys(export, rank=r, world=2, workers=workers, epoch=epoch) for r in (0, 1)]
        assert len(ranks[0]) == len(ranks[1]) == 12
        counts = collections.Counter(ranks[0] + ranks[1])
        padded = ds[IndexPermutation(N, 0, epoch)(0)]["__key__"]  # the one repeat
        assert set(counts) == all_keys
        assert {k for k, c in counts.items() if c > 1} == {padded}
        assert counts[padded] == 2
        orders.append(ranks[0] + ranks[1])
    assert len({tuple(o) for o in orders}) == 3  # a new order every epoch
    again = [map_keys(export, rank=r, world=2, workers=workers, epoch=1) for r in (0, 1)]
    assert again[0] + again[1] == orders[1]  # the same seed gives the same order


class _Recorded(LatencyStorage):
    """Records each batch of ranged reads when it is sent (by this process)."""

    def __init__(self, inner: MemoryStorage) -> None:
        super().__init__(inner)
        self.batches: list[int] = []

    def submit_range_batch(self, requests: Any) -> Any:
        self.batches.append(len(requests))
        return super().submit_range_batch(requests)


def test_lookahead_tells_each_batch_the_one_its_worker_gets_next() -> None:
    batches = [[0, 1], [2, 3], [4, 5], [6, 7], [8]]
    got = list(Lookahead(batches, 2))
    assert got == batches
    assert len(Lookahead(batches, 2)) == 5
    assert [b.ahead for b in got] == [[4, 5], [6, 7], [8], None, None]  # type: ignore[attr-defined]
    sent = [pickle.loads(pickle.dumps(b)) for b in got]  # as a worker receives them
    assert [b.ahead for b in sent] == [b.ahead for b in got]  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_next_batch_is_requested_while_one_is_made_and_every_batch_is_right(
    workers: int,
) -> None:
    url = f"memory://lookahead-{workers}/export"
    data = {"key": [f"k{i:03d}" for i in range(96)], "bin": [bytes([i]) * 200 for i in range(96)]}
    shardex.export(data, url, workers=1, samples_per_shard=16)
    slow = _Recorded(MemoryStorage(url))
    ds = MapDataset(slow, decode=False)
    order = [int(i) for i in np.random.default_rng(0).permutation(96)]
    loader = ds.dataloader(8, sampler=order, num_workers=workers, collate_fn=keep)
    assert isinstance(MapDataset(slow).dataloader(8).sampler, ShardexSampler)
    it = iter(loader)
    first = next(it)
    if workers == 0:  # the reads are this process's: the second batch is already sent
        assert len(slow.batches) == 2
    keys = [s["__key__"] for batch in [first, *it] for s in batch]
    assert keys == [f"k{i:03d}" for i in order]
    if workers == 0:
        assert len(slow.batches) == 12  # no batch was requested twice
    guesses = list(Lookahead([order[:8], order[8:16], order[16:24], order[24:32]], 1))
    sent = len(slow.batches)
    ds.__getitems__(guesses[0])  # guesses that order[8:16] comes next
    made = ds.__getitems__(guesses[2])  # a wrong guess: this process gets batches otherwise
    assert [s["__key__"] for s in made] == [f"k{i:03d}" for i in order[16:24]]
    assert len(slow.batches) == sent + 3  # the wrong guess, then no more guessing


@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_gives_every_rank_exactly_equal_counts(export: Path, workers: int) -> None:
    all_keys = {s["__key__"] for s in shardex.open_dataset(export)}
    orders = []
    for epoch in range(3):
        ranks = [stream_keys(export, rank=r, world=2, workers=workers, epoch=epoch) for r in (0, 1)]
        assert len(ranks[0]) == len(ranks[1]) == 12  # 24 = 23 + one wrapped-around sample
        counts = collections.Counter(ranks[0] + ranks[1])
        assert set(counts) == all_keys
        assert sorted(counts.values()) == [1] * 22 + [2]
        orders.append(ranks[0] + ranks[1])
    assert len({tuple(o) for o in orders}) == 3
    again = [stream_keys(export, rank=r, world=2, workers=workers, epoch=2) for r in (0, 1)]
    assert again[0] + again[1] == orders[2]
    dropped = [
        stream_keys(export, rank=r, world=2, workers=workers, epoch=0, drop_last=True)
        for r in (0, 1)
    ]
    assert len(dropped[0]) == len(dropped[1]) == 11
    assert len(set(dropped[0] + dropped[1])) == 22


def test_stream_loader_length_and_state_checks(export: Path) -> None:
    ds = StreamDataset(export, decode=False, rank=0, world_size=2, buffer_size=5)
    loader = ds.dataloader(batch_size=4, num_workers=2, collate_fn=keep)
    assert len(loader) == len(list(loader)) == 4  # 6 + 6 samples: 4 + 2 per worker
    with pytest.raises(ConfigError, match="persistent_workers"):
        ds.dataloader(batch_size=4, num_workers=2, persistent_workers=True)
    ds.advance(3)
    with pytest.raises(ConfigError, match="batch boundary"):
        ds.state_dict()
    plain = StreamDataset(export, decode=False)
    keys_of(DataLoader(plain, batch_size=4, num_workers=2, collate_fn=keep))
    plain.advance(4)
    with pytest.raises(ConfigError, match=r"dataloader\(\.\.\.\)"):
        plain.state_dict()
    state = StreamDataset(export, rank=0, world_size=2).state_dict()
    with pytest.raises(ConfigError, match="rank=0"):
        StreamDataset(export, rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"not a shardex\.StreamDataset state"):
        StreamDataset(export).load_state_dict(ShardexSampler(N).state_dict())


# -- what items hold ----------------------------------------------------------------------------


def test_items_hold_decoded_images_labels_and_metadata_columns(export: Path) -> None:
    raw = shardex.open_dataset(export)
    meta = raw.metadata
    ds = MapDataset(export, keys=("score", "embedding", "caption"))
    for i in (0, 4, 22):
        item, sample = ds[i], raw[i]
        image = next(v for k, v in sample.items() if k in ("jpg", "png", "webp"))
        pixels = decode(image)
        assert item["__key__"] == sample["__key__"]
        assert item["image"].dtype == torch.uint8
        assert item["image"].shape == pixels.shape
        assert torch.equal(item["image"], torch.from_numpy(pixels.copy()))
        assert item["label"] == int(sample["cls"])
        assert item["score"] == meta.column("score")[i].as_py()
        assert item["embedding"].tolist() == meta.column("embedding")[i].as_py()
        assert item["caption"] == meta.column("caption")[i].as_py()
    assert MapDataset(export, decode=False)[3] == raw[3]
    assert MapDataset(export, keys=("label",), transform=crop)[5]["image"].shape == (8, 8, 3)
    with pytest.raises(ConfigError, match=r"no column 'nope'.*score"):
        MapDataset(export, keys=("nope",))[0]
    streamed = {s["__key__"]: s for s in StreamDataset(export, decode=False, seed=3)}
    assert streamed == {s["__key__"]: s for s in raw}


def test_datasets_pickle_small_and_read_after_unpickling(export: Path) -> None:
    for ds in (MapDataset(export), StreamDataset(export)):
        assert len(ds) == N  # opens the split
        data = pickle.dumps(ds)
        assert len(data) < 2000  # names and flags: no index, no config, no handles
        assert len(pickle.loads(data)) == N
    copy = pickle.loads(pickle.dumps(MapDataset(export, decode=False)))
    assert copy[2] == MapDataset(export, decode=False)[2]


# -- fork, spawn, object storage, shared memory ------------------------------------------


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_workers_fork_or_spawn_on_local_and_s3(
    where: str, context: str, export: Path, request: pytest.FixtureRequest
) -> None:
    before = shm_entries()
    uri: Any = export
    options: dict[str, Any] | None = None
    if where == "s3":
        s3: S3Location = request.getfixturevalue("s3")
        uri, options = s3.url, s3.direct
        shardex.export(
            str(export), uri, storage_options=options, samples_per_shard=SHARD, workers=1
        )
    expected = {s["__key__"]: int(s["cls"]) for s in shardex.open_dataset(export)}
    ds = MapDataset(uri, transform=crop, storage_options=options)
    sampler = ShardexSampler(len(ds), seed=1)
    loader = DataLoader(ds, 4, sampler=sampler, num_workers=2, multiprocessing_context=context)
    got = {}
    for batch in loader:
        assert batch["image"].shape[1:] == (8, 8, 3)
        got.update(zip(batch["__key__"], batch["label"].tolist(), strict=True))
    assert got == expected
    stream = StreamDataset(uri, transform=crop, storage_options=options, buffer_size=4)
    streamed = collections.Counter()
    for batch in stream.dataloader(4, num_workers=2, multiprocessing_context=context):
        streamed.update(zip(batch["__key__"], batch["label"].tolist(), strict=True))
    assert streamed == collections.Counter(expected.items())
    gc.collect()  # the loaders' queues (named semaphores under spawn) go with their iterators
    assert shm_left_behind(before) == set()


_COUNT_THEN_FORK = """
import json, sys
from torch.utils.data import DataLoader
from shardex.storage.direct import forked_after_io, runtime_started
from shardex.torch import MapDataset, ShardexSampler

def where(sample):
    return sample["__key__"], forked_after_io()

ds = MapDataset(sys.argv[1], decode=False, transform=where, storage_options=json.loads(sys.argv[2]))
if sys.argv[3] == "read first":
    ds[0]
sampler = ShardexSampler(len(ds))
print(json.dumps([runtime_started(), *ds.dataloader(4, sampler=sampler, num_workers=2, collate_fn=list)]))
"""


@pytest.mark.parametrize("first", ["count only", "read first"])
def test_forked_workers_request_directly_when_the_main_process_only_counted(
    first: str, export: Path, s3: S3Location
) -> None:
    shardex.export(
        str(export), s3.url, storage_options=s3.direct, samples_per_shard=SHARD, workers=1
    )
    args = [s3.url, json.dumps(s3.direct), first]
    run = subprocess.run(
        [sys.executable, "-c", _COUNT_THEN_FORK, *args], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    started, *batches = json.loads(run.stdout)
    items = [item for batch in batches for item in batch]
    assert sorted(key for key, _ in items) == sorted(
        s["__key__"] for s in shardex.open_dataset(export)
    )
    # counting went through a helper process, so the forked workers use obstore themselves;
    # after a read in the main process they must send their requests to helpers
    assert started == (first == "read first")
    assert {helper for _, helper in items} == {first == "read first"}


def test_streaming_reads_one_ranged_get_per_run_and_resumes_without_rereading(
    s3: S3Location, export: Path
) -> None:
    shardex.export(
        str(export), s3.url, storage_options=s3.direct, samples_per_shard=SHARD, workers=1
    )
    proxy = s3.proxy

    def reads(ds: StreamDataset) -> tuple[list[str], list[Any]]:
        len(ds)  # opening (config.yaml, index) is not counted
        proxy.reset()
        keys = [sample["__key__"] for sample in ds]
        proxy.wait_idle()
        # len() counted through a helper process (see MapDataset): the reading process
        # opens the export itself, reading config.yaml again
        return keys, [r for r in proxy.requests if not r.key.endswith("/config.yaml")]

    def stream(**kw: Any) -> StreamDataset:
        return StreamDataset(s3.url, decode=False, storage_options=s3.counted, seed=1, **kw)

    keys, requests = reads(stream(buffer_size=4))
    # one per shard (6 shards), and the first read fetches index-members.npy's only page
    # (then cached)
    assert [r.method for r in requests] == ["GET"] * 7
    assert sum("/index-members.npy" in r.key for r in requests) == 1
    whole = sum(r.body_bytes for r in requests if "/index-" not in r.key)
    assert len(reads(stream(buffer_size=4, block_bytes=1))[1]) == N  # one sample per run

    first = stream(buffer_size=4)
    head = [sample["__key__"] for _, sample in zip(range(15), first, strict=False)]
    first.advance(15)
    resumed = stream(buffer_size=4)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    rest, requests = reads(resumed)
    assert head + rest == keys
    assert sum(r.body_bytes for r in requests) < whole / 2  # the buffer and the unread rest


# -- a real two-process torch.distributed job ------------------------------------------------


def _ddp_rank(rank: int, uri: str, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2
    )
    try:
        ds = MapDataset(uri, decode=False)
        sampler = ShardexSampler(len(ds), seed=9)  # rank and world size from the group
        sampler.set_epoch(1)
        mine = {
            "map": keys_of(DataLoader(ds, batch_size=5, sampler=sampler, collate_fn=keep)),
            "stream": keys_of(
                StreamDataset(uri, decode=False, seed=9).dataloader(5, collate_fn=keep)
            ),
        }
        gathered: list[Any] = [None, None]
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            Path(folder, "result.json").write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_job_covers_every_sample_exactly(export: Path, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_ddp_rank, args=(str(export), str(tmp_path)), nprocs=2, join=True)
    ranks = json.loads((tmp_path / "result.json").read_text())
    keys = {s["__key__"] for s in shardex.open_dataset(export)}
    for kind in ("map", "stream"):
        first, second = ranks[0][kind], ranks[1][kind]
        assert len(first) == len(second) == 12
        counts = collections.Counter(first + second)
        assert set(counts) == keys
        assert sum(counts.values()) == 24
    assert ranks[0]["map"] == map_keys(export, rank=0, world=2, workers=0, epoch=1, seed=9)


# -- resume: one helper for every loader --------------------------------------------------------


@dataclass(frozen=True)
class Resume:
    """A resume scenario: the loader, its workers before and after the restart, and the
    number of batches the training loop takes before the state is saved."""

    kind: str  # "map", "stream", "window"; "-sdl": torchdata's loader; "-batches": collated
    stop_after: int
    workers: int
    workers_after: int
    batch_size: int = 3


class LoaderState:
    """A ``StatefulDataLoader``'s state, as the resume helper handles states: the loop
    calls no ``advance()``; ``set_epoch`` goes to the sampler or dataset."""

    def __init__(self, loader: Any, holder: Any) -> None:
        self.loader, self.holder = loader, holder

    def set_epoch(self, epoch: int) -> None:
        self.holder.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.holder.epoch, "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])


def _loader(kind: str, uri: str, workers: int, batch_size: int) -> tuple[Iterable[Any], Any]:
    """A loader on rank 1 of 2 and the object holding its state (sampler or dataset).

    Kinds with ``-sdl`` use torchdata's ``StatefulDataLoader`` and its own state; kinds
    ending in ``-batches`` read decoded images into batches made by shardex's collate.
    """
    if kind == "window":  # its own batches; workers are its prefetch threads
        windows = TensorShardsLoader(
            uri,
            batch_size,
            rank=1,
            world_size=2,
            seed=7,
            shards_per_window=2,
            prefetch_workers=max(workers, 1),
        )
        return windows, windows
    make: Any = DataLoader
    stateful = "-sdl" in kind
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        make = StatefulDataLoader
    # "-batches": decoded, equal-sized images in dict batches made by shardex.torch.collate
    # (packed in place and passed through reused shared memory by the dataloader() loaders)
    batches = kind.endswith("-batches")
    items: dict[str, Any] = {"transform": crop} if batches else {"decode": False}
    collate: dict[str, Any] = {"collate_fn": shardex.torch.collate} if batches else {}
    holder: Any
    if kind.startswith("map"):
        ds = MapDataset(uri, **items)
        holder = ShardexSampler(len(ds), rank=1, world_size=2, seed=7)
        if batches and not stateful:
            loader = ds.dataloader(batch_size, sampler=holder, num_workers=workers)
        else:
            loader = make(
                ds,
                batch_size=batch_size,
                sampler=holder,
                num_workers=workers,
                **(collate or {"collate_fn": keep}),
            )
    else:
        holder = StreamDataset(uri, rank=1, world_size=2, seed=7, buffer_size=5, **items)
        if stateful:
            loader = make(
                holder,
                batch_size=batch_size,
                num_workers=workers,
                **(collate or {"collate_fn": keep}),
            )
        else:
            loader = holder.dataloader(
                batch_size, num_workers=workers, **({} if batches else {"collate_fn": keep})
            )
    return loader, LoaderState(loader, holder) if stateful else holder


def _epoch(loader: Iterable[Any], stateful: Any, epoch: int, stop: int | None = None) -> list[str]:
    """Keys the training loop takes in one epoch (``stop`` batches, or all)."""
    stateful.set_epoch(epoch)
    keys: list[str] = []
    counts_itself = isinstance(stateful, (TensorShardsLoader, LoaderState))
    for i, batch in enumerate(loader):
        if i == stop:  # taken from the loader, not used: advance() is not told of it
            break
        if isinstance(batch, dict):  # TensorShardsLoader, collated batches
            got = list(batch["__key__"])
            if "image" in batch:
                assert batch["image"].shape == (len(got), 8, 8, 3)
        else:
            got = [sample["__key__"] for sample in batch]
        keys += got
        if counts_itself:  # its state counts every batch it has handed out
            if i + 1 == stop:
                break
            continue
        stateful.advance(len(got))
    return keys


def _resume_child() -> None:
    """In a fresh process: load each state, finish its epoch, then run the next one."""
    job = json.load(sys.stdin)
    out = []
    for case, state in zip(job["cases"], job["states"], strict=True):
        loader, stateful = _loader(
            case["kind"], job["uri"], case["workers_after"], case["batch_size"]
        )
        stateful.load_state_dict(state)
        rest = _epoch(loader, stateful, state["epoch"])
        out.append({"rest": rest, "next": _epoch(loader, stateful, state["epoch"] + 1)})
    json.dump(out, sys.stdout)


def assert_resumes(uri: Path, cases: list[Resume]) -> None:
    """Stop after k batches, save the state as JSON, restore it in a fresh process and
    continue: the keys before and after make up the uninterrupted epoch (in order when
    the order is defined to survive the change of workers), and the next epoch is the
    uninterrupted next epoch (on the workers after the restart)."""
    states, expected = [], []
    for case in cases:
        loader, stateful = _loader(case.kind, str(uri), case.workers, case.batch_size)
        epoch0 = _epoch(loader, stateful, 0)
        loader, stateful = _loader(case.kind, str(uri), case.workers_after, case.batch_size)
        full = (epoch0, _epoch(loader, stateful, 1))  # the next epoch runs on the new workers
        loader, stateful = _loader(case.kind, str(uri), case.workers, case.batch_size)
        head = _epoch(loader, stateful, 0, stop=case.stop_after)
        assert 0 < len(head) < len(full[0])
        states.append(json.loads(json.dumps(stateful.state_dict())))
        expected.append((head, full))
    job = {"uri": str(uri), "cases": [asdict(c) for c in cases], "states": states}
    paths = [str(Path(__file__).resolve().parent), str(TESTS)]  # this file, helpers.py
    code = f"import sys; sys.path[:0] = {paths!r}; import test_torch; test_torch._resume_child()"
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(job), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    for case, (head, full), got in zip(cases, expected, json.loads(done.stdout), strict=True):
        if not case.kind.startswith("stream") or case.workers == case.workers_after:
            assert head + got["rest"] == full[0], case
        else:  # a stream resumed on other workers: exactly the rest, in a new order
            assert sorted(head + got["rest"]) == sorted(full[0]), case
        assert got["next"] == full[1], case


def test_map_style_resumes_mid_epoch_in_a_fresh_process(export: Path) -> None:
    assert_resumes(
        export,
        [
            Resume("map", 2, workers=2, workers_after=2),
            Resume("map", 1, workers=2, workers_after=0),
            Resume("map-batches", 2, workers=2, workers_after=2),
            Resume("map-batches", 1, workers=0, workers_after=2),
        ],
    )


def test_streaming_resumes_mid_epoch_in_a_fresh_process(export: Path) -> None:
    assert_resumes(
        export,
        [
            Resume("stream", 2, workers=0, workers_after=0),
            Resume("stream", 1, workers=2, workers_after=2),  # mid-round: worker 1 is next
            Resume("stream", 3, workers=2, workers_after=0),
            Resume("stream-batches", 1, workers=2, workers_after=2),
            Resume("stream-batches", 2, workers=0, workers_after=2),
        ],
    )


# torchdata's StatefulDataLoader warns about torch's deprecated set_vital when it is made.
sdl_warning = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@sdl_warning
def test_stateful_dataloader_resumes_mid_epoch_in_a_fresh_process(export: Path) -> None:
    """torchdata's own loader state, no advance() calls: the sampler's and the stream's
    iterators count what they give out, and the loader records that with each batch."""
    pytest.importorskip("torchdata")
    assert_resumes(
        export,
        [
            Resume("map-sdl", 2, workers=0, workers_after=0),
            Resume("map-sdl", 3, workers=2, workers_after=2),  # 4 batches prefetched
            Resume("stream-sdl", 2, workers=0, workers_after=0),
            Resume("stream-sdl", 1, workers=2, workers_after=2),  # mid-round: worker 1 is next
            Resume("stream-sdl", 2, workers=2, workers_after=2, batch_size=2),
            Resume("map-sdl-batches", 2, workers=2, workers_after=2),
            Resume("stream-sdl-batches", 1, workers=2, workers_after=2),
        ],
    )


@sdl_warning
@pytest.mark.parametrize("kind", ["map-sdl", "stream-sdl"])
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_state_follows_set_epoch(export: Path, kind: str, workers: int) -> None:
    """The loader loads its state when iterated, after the loop's set_epoch(): a state of
    another epoch (e.g. saved at the end of the previous one) gives that epoch afresh."""
    pytest.importorskip("torchdata")
    uri = str(export)
    reference = {e: _epoch(*_loader(kind, uri, workers, 3), e) for e in (1, 2)}
    loader, stateful = _loader(kind, uri, workers, 3)
    assert _epoch(loader, stateful, 1) == reference[1]
    at_end = json.loads(json.dumps(stateful.state_dict()))
    _, stateful = _loader(kind, uri, workers, 3)
    _epoch(stateful.loader, stateful, 1, stop=2)
    mid = json.loads(json.dumps(stateful.state_dict()))
    for state in (at_end, mid):
        loader, stateful = _loader(kind, uri, workers, 3)
        stateful.load_state_dict(state)
        assert _epoch(loader, stateful, 2) == reference[2]
        assert _epoch(loader, stateful, 1) == reference[1]


# -- the guide ----------------------------------------------------------------------------------


def test_torch_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = (TESTS.parent / "docs" / "torch.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/torch.md", "exec"), scope)
    assert scope["images"].shape[1:] == (3, 32, 32)
    assert scope["resumed_keys"] == scope["remaining_keys"]


@sdl_warning
def test_torch_docs_stateful_dataloader_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchdata")
    monkeypatch.chdir(tmp_path)
    text = (TESTS.parent / "docs" / "torch.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    scope: dict[str, Any] = {}
    exec(compile(blocks[0], "docs/torch.md", "exec"), scope)
    (example,) = [b for b in blocks if "StatefulDataLoader(" in b]
    exec(compile(example, "docs/torch.md", "exec"), scope)
    for kind in ("map", "stream"):
        assert 0 < len(scope["head"][kind]) < len(scope["whole_epoch"][kind])
        assert scope["head"][kind] + scope["rest"][kind] == scope["whole_epoch"][kind]


def test_decode_size_decodes_large_jpegs_at_a_reduced_scale(tmp_path: Path) -> None:
    import io

    from PIL import Image

    from shardex.codecs.images import decode

    big = io.BytesIO()
    Image.new("RGB", (1600, 1200), (200, 30, 30)).save(big, "JPEG")
    assert decode(big.getvalue()).shape == (1200, 1600, 3)
    assert decode(big.getvalue(), size_hint=(224, 224)).shape == (300, 400, 3)  # 1/4 scale
    png = io.BytesIO()
    Image.new("RGB", (640, 480)).save(png, "PNG")
    assert decode(png.getvalue(), size_hint=(224, 224)).shape == (480, 640, 3)  # full size
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(big.getvalue())
    shardex.export(tmp_path / "src", tmp_path / "out", workers=1)
    dataset = MapDataset(tmp_path / "out", decode_size=(224, 224))
    assert tuple(dataset[0]["image"].shape) == (300, 400, 3)


# -- the window loader (tensor_shards) ----------------------------------------------------------


@pytest.fixture(scope="module")
def tensor_export(export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tensor") / "out"
    shardex.export(export, out, backend="tensor_shards", samples_per_shard=SHARD, workers=1)
    return out


def _keys(loader: TensorShardsLoader, epoch: int) -> list[str]:
    loader.set_epoch(epoch)
    return [k for batch in loader for k in batch["__key__"]]


@pytest.mark.parametrize("batch_size", [1, 5, SHARD, 3 * SHARD + 1])
def test_window_loader_reads_every_sample_once_per_epoch(
    tensor_export: Path, batch_size: int
) -> None:
    loader = TensorShardsLoader(tensor_export, batch_size, shards_per_window=2, seed=3)
    everything = sorted(shardex.open_dataset(tensor_export).keys())
    epochs = [_keys(loader, e) for e in range(3)]
    for keys in epochs:
        assert sorted(keys) == everything
    assert len({tuple(k) for k in epochs}) == 3  # a new order every epoch
    again = TensorShardsLoader(tensor_export, batch_size, shards_per_window=2, seed=3)
    assert _keys(again, 1) == epochs[1]  # the same seed, the same order
    sizes = [len(b["__key__"]) for b in loader]
    assert sizes[:-1] == [batch_size] * (len(sizes) - 1)  # independent of the shard size
    assert len(sizes) == len(loader)


def test_window_loader_batches_are_tensors_and_drop_last(tensor_export: Path) -> None:
    loader = TensorShardsLoader(tensor_export, 4, drop_last=True, seed=1)
    batches = list(loader)
    assert all(len(b["__key__"]) == 4 for b in batches)
    assert len(batches) == len(loader) == N // 4
    labels = batches[0]["cls"]
    assert labels.dtype == torch.int64
    assert tuple(labels.shape) == (4,)
    ds = shardex.open_dataset(tensor_export)
    by_key = {ds[i]["__key__"]: int(ds[i]["cls"]) for i in range(len(ds))}
    assert labels.tolist() == [by_key[k] for k in batches[0]["__key__"]]
    assert isinstance(batches[0]["json"][0], bytes)  # ragged fields come as lists


@pytest.mark.parametrize("world_size", [2, 3])
def test_window_loader_ranks_get_equal_disjoint_shares(
    tensor_export: Path, world_size: int
) -> None:
    shares = [
        _keys(TensorShardsLoader(tensor_export, 4, rank=r, world_size=world_size, seed=2), 1)
        for r in range(world_size)
    ]
    assert len({len(s) for s in shares}) == 1
    assert len(shares[0]) == N // world_size
    seen = [k for s in shares for k in s]
    assert len(seen) == len(set(seen))


def test_window_loader_resumes_mid_epoch_in_a_fresh_process(tensor_export: Path) -> None:
    assert_resumes(
        tensor_export,
        [
            Resume("window", 2, workers=0, workers_after=0),
            Resume("window", 5, workers=2, workers_after=1, batch_size=2),
        ],
    )


def test_window_loader_refuses_a_tar_export(export: Path) -> None:
    with pytest.raises(ConfigError, match="StreamDataset"):
        TensorShardsLoader(export, 4)


def test_exported_dataset_defaults_to_the_only_split_and_batches_embeddings(
    tmp_path: Path,
) -> None:
    shardex.export("demo:10", tmp_path / "one", samples_per_shard=4, workers=1)
    # demo images differ in size: a score as the feature keeps default collation possible
    ds = shardex.ExportedDataset(
        tmp_path / "one", feature_keys=("aesthetic_score",), label_keys=("label", "embedding")
    )
    embeddings = shardex.open_dataset(tmp_path / "one").metadata.column("embedding")
    batch = next(iter(DataLoader(ds, batch_size=4)))  # type: ignore[arg-type]
    got = batch["labels"]["embedding"]
    assert isinstance(got, torch.Tensor)
    assert tuple(got.shape) == (4, 16)
    np.testing.assert_array_equal(got.numpy(), np.array(embeddings.to_pylist()[:4]))
    assert batch["labels"]["label"].tolist() == [ds[i]["labels"]["label"] for i in range(4)]
    assert tuple(batch["features"]["aesthetic_score"].shape) == (4,)
    shardex.export("demo:10", tmp_path / "two", split_fractions={"a": 0.5, "b": 0.5}, workers=1)
    both = shardex.ExportedDataset(tmp_path / "two")
    assert len(both) == 10  # every split, in export_index order
    assert [item["key"].split("/")[1] for item in both] == [f"{i:06d}" for i in range(10)]
    assert {item["split"] for item in both} == {"a", "b"}
    with pytest.raises(ConfigError, match="split="):
        _ = both.dataset  # one Dataset only for one split
