"""Batches of ranged reads (``shardex.storage.batch``): requests in flight bounded, slow
ones hedged within a budget; the index of a remote export read by pages
(``shardex.storage.paged``); the latency storage that measures both.

Hedging against the real server is in ``test_s3.py``; here an in-memory storage adds
latency a loopback server cannot."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import shardex
from shardex.errors import ChecksumError, ConfigError, ObjectNotFoundError
from shardex.storage import LocalStorage, ObjectStorage
from shardex.storage.batch import BatchPolicy, event_loop, fetch_all, read_stats, run
from shardex.storage.latency import LatencyStorage
from shardex.storage.memory import MemoryStorage
from shardex.storage.paged import PAGE


@pytest.fixture(autouse=True)
def _fresh_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(tmp_path / "cache"))
    read_stats.reset(latencies=True)


def _warm(seconds: float) -> None:
    """Latencies seen, as after a few batches at ``seconds`` each."""
    for _ in range(64):
        read_stats.record(seconds)


def test_a_batch_keeps_its_order_and_bounds_the_requests_in_flight() -> None:
    flying, most = 0, 0

    async def fetch(path: str, start: int, length: int) -> bytes:
        nonlocal flying, most
        flying += 1
        most = max(most, flying)
        await asyncio.sleep(random.random() / 200)
        flying -= 1
        return f"{path}:{start}:{length}".encode()

    requests = [(f"p{i % 3}", i, i + 1) for i in range(40)]
    got = run(fetch_all(fetch, requests, BatchPolicy(concurrency=5)))
    assert got == [f"{p}:{s}:{n}".encode() for p, s, n in requests]
    assert most == 5


def test_a_slow_request_is_hedged_and_the_first_answer_wins() -> None:
    _warm(0.05)  # hedge after 60 ms; the other requests answer at once
    slow = {7, 19}
    calls: dict[int, int] = {}

    async def fetch(path: str, start: int, length: int) -> bytes:
        calls[start] = calls.get(start, 0) + 1
        await asyncio.sleep(30 if calls[start] == 1 and start in slow else 0)
        return b"%d" % start

    began = time.monotonic()
    # budget 1: a loaded machine may hedge a few more, which must not starve these two
    got = run(fetch_all(fetch, [("o", i, 1) for i in range(64)], BatchPolicy(budget=1.0)))
    assert time.monotonic() - began < 20  # not the 30 s of the stalled requests
    assert got == [b"%d" % i for i in range(64)]
    assert read_stats.hedges_won >= 2
    assert all(calls[i] >= 2 for i in slow)


def test_hedges_stay_within_their_budget_and_can_be_turned_off() -> None:
    _warm(0.001)

    async def fetch(path: str, start: int, length: int) -> bytes:
        await asyncio.sleep(0.05)  # every request "slow"
        return b"x"

    requests = [("o", i, 1) for i in range(200)]
    run(fetch_all(fetch, requests, BatchPolicy(hedge=False)))
    assert read_stats.hedged == 0
    read_stats.reset(latencies=True)
    _warm(0.001)
    run(fetch_all(fetch, requests, BatchPolicy(budget=0.05)))
    assert 1 <= read_stats.hedged <= 0.05 * read_stats.requests + 1


def test_a_garbage_collection_during_a_batch_is_not_a_slow_request() -> None:
    junk: list[list[int]] = []
    took = 0.0
    while took < 0.15 and len(junk) < 16_000_000:  # a heap whose full collection takes long
        junk.extend([i] for i in range(len(junk) or 1_000_000))
        began = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - began
    # hedge after 60 ms: the collection below starts long before, even on a loaded machine
    _warm(0.05)

    async def fetch(path: str, start: int, length: int) -> bytes:
        await asyncio.sleep(0.1)  # answered during the collection (0.15 s or more)
        return b"x"

    batch = event_loop().submit(
        fetch_all(fetch, [("o", i, 1) for i in range(64)], BatchPolicy(budget=1.0))
    )
    time.sleep(0.005)
    began = time.perf_counter()
    gc.collect()  # every thread stands still, the I/O loop's too
    took = time.perf_counter() - began
    assert batch.result() == [b"x"] * 64
    assert read_stats.hedged == 0  # the requests answered during the collection
    assert max(read_stats.latencies) < took / 2  # the collection's time is not recorded


def test_a_hedge_answers_when_the_first_request_fails_and_both_failing_raise() -> None:
    _warm(0.01)
    seen: dict[int, int] = {}

    async def fetch(path: str, start: int, length: int) -> bytes:
        seen[start] = seen.get(start, 0) + 1
        if seen[start] == 1:
            await asyncio.sleep(0.2)
            raise OSError("first attempt broke")
        if start == 1:
            raise OSError("hedge broke too")
        return b"ok"

    assert run(fetch_all(fetch, [("o", 0, 1)], BatchPolicy())) == [b"ok"]
    with pytest.raises(OSError, match="broke"):
        run(fetch_all(fetch, [("o", 1, 1)], BatchPolicy()))


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("read_concurrency", "many", "'read_concurrency' must be a whole number"),
        ("read_concurrency", True, "'read_concurrency' must be a whole number"),
        ("hedge", "maybe", "'hedge' must be true or false"),
    ],
)
def test_bad_batch_options_are_one_line_errors(option: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        ObjectStorage("s3://bucket/export", {option: value})
    assert "\n" not in str(caught.value)


def test_batch_options_are_read_from_the_storage_options() -> None:
    from shardex.storage.options import batch_policy

    assert batch_policy({}) == BatchPolicy()
    assert batch_policy({"read_concurrency": "128", "hedge": "false"}) == BatchPolicy(128, False)


@pytest.fixture
def export() -> MemoryStorage:
    rng = random.Random(0)
    n = 6000
    data = {"key": [f"k{i:05d}" for i in range(n)], "bin": [rng.randbytes(300) for _ in range(n)]}
    url = f"memory://batch-{uuid.uuid4().hex}/export"
    shardex.export(data, url, workers=1, samples_per_shard=1000)
    return MemoryStorage(url)


class _Stalling(LatencyStorage):
    """Ranged reads answer at once, but the calls numbered in ``stalled`` take 30 s."""

    stalled: frozenset[int] = frozenset()

    def _wait(self) -> float:
        super()._wait()
        return 30.0 if self.gets in self.stalled else 0.0


def test_stalled_reads_of_a_real_export_are_hedged_to_the_same_samples(
    export: MemoryStorage,
) -> None:
    direct = shardex.open_dataset(export)
    slow = _Stalling(export, policy=BatchPolicy(budget=1.0))  # see the test above
    ds = shardex.open_dataset(slow)
    assert len(ds.records) == len(ds)  # the whole index local: only the batch follows
    _warm(0.05)
    picks = random.Random(1).sample(range(len(ds)), 64)
    slow.stalled = frozenset({slow.gets + 3, slow.gets + 40})  # two first attempts
    began = time.monotonic()
    assert ds.get_many(picks) == direct.get_many(picks)
    assert time.monotonic() - began < 20  # not the 30 s of the stalled requests
    assert read_stats.hedges_won >= 2


class _Held(LatencyStorage):
    """Ranged batches are sent (counted in ``sent``) but answer only once ``release`` is set."""

    def __init__(self, inner: MemoryStorage) -> None:
        super().__init__(inner)
        self.release, self.sent = threading.Event(), 0

    async def _batch(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        self.sent += len(requests)
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait)
        return await super()._batch(requests)


def _until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "the requests were never sent"
        time.sleep(0.01)


def test_start_many_sends_the_requests_before_the_samples_are_asked(
    export: MemoryStorage,
) -> None:
    direct = shardex.open_dataset(export)
    held = _Held(export)
    held.release.set()
    ds = shardex.open_dataset(held)
    assert len(ds.records) == len(ds)  # the whole index local: only the batch follows
    held.release.clear()
    picks = random.Random(3).sample(range(0, len(ds), 90), 64)  # no two samples touch
    sent = held.sent
    finish = ds.start_many(picks)  # returns while every request waits on the storage
    _until(lambda: held.sent == sent + 64)  # all of the batch in flight, none answered yet
    held.release.set()
    assert finish() == direct.get_many(picks) == ds.get_many(picks)
    with pytest.raises(IndexError):
        ds.start_many([len(ds)])


def test_a_storage_without_concurrent_reads_starts_a_batch_that_raises_when_asked(
    export: MemoryStorage,
) -> None:
    future = export.submit_range_batch([("config.yaml", 0, 10), ("missing", 0, 1)])
    with pytest.raises(ObjectNotFoundError):
        future.result()
    assert export.submit_range_batch([("config.yaml", 0, 10)]).result() == [
        export.get("config.yaml")[:10]
    ]


def test_the_index_is_read_by_pages_as_reads_need_them(export: MemoryStorage) -> None:
    slow = LatencyStorage(export)
    ds = shardex.open_dataset(slow)
    opened = slow.bytes_read
    assert opened <= PAGE + (16 << 10)  # config.yaml and the first page of the records
    assert len(ds) == 6000  # from config.yaml: no page
    direct = shardex.open_dataset(export)
    assert ds[4321] == direct[4321]
    assert slow.bytes_read - opened <= 3 * PAGE + 2000  # members' first page, two rows' pages
    assert ds.get("k00077") == direct[77]
    assert list(ds) == list(direct)


def test_a_page_without_its_flag_is_fetched_again_and_a_bad_page_fails_its_reads(
    export: MemoryStorage, tmp_path: Path
) -> None:
    ds = shardex.open_dataset(LatencyStorage(export))
    ds[10]
    (records,) = (tmp_path / "cache").rglob("index-samples.paged")
    flags = records.with_suffix(".pages")
    flags.write_bytes(bytes(len(flags.read_bytes())))  # as if killed before the flags
    slow = LatencyStorage(export)
    again = shardex.open_dataset(slow)
    assert again[10] == shardex.open_dataset(export)[10]
    assert slow.gets >= 2  # the records' page again, then the sample
    with open(records, "r+b") as f:  # a page gone wrong, its flag set
        f.seek(PAGE // 2)
        f.write(bytes(range(256)) * 8)
    damaged = shardex.open_dataset(LatencyStorage(export))
    number = (PAGE // 2 - 128) // 24 + 10
    with pytest.raises((ChecksumError, shardex.errors.FormatError)):
        damaged[number]


_READ_ONE = """
import sys
import shardex
from shardex.storage import LocalStorage
from shardex.storage.latency import LatencyStorage
slow = LatencyStorage(LocalStorage(sys.argv[1]))
print(shardex.open_dataset(slow)[int(sys.argv[2])]["__key__"], slow.gets)
"""


def test_a_nodes_processes_share_the_pages_any_of_them_fetched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    n = 3000
    shardex.export({"key": [f"k{i}" for i in range(n)], "txt": [b"x"] * n}, out, workers=1)
    assert isinstance(LatencyStorage(LocalStorage(out)).local_path("x"), type(None))
    env = {**os.environ, "SHARDEX_CACHE_DIR": str(tmp_path / "cache")}

    def read(i: int) -> list[str]:
        command = [sys.executable, "-c", _READ_ONE, str(out), str(i)]
        return subprocess.run(
            command, env=env, capture_output=True, text=True, check=True
        ).stdout.split()

    assert read(2500) == ["k2500", "6"]  # config, 3 first pages, a row's page, the sample
    assert read(2500) == ["k2500", "2"]  # config and the sample: the pages are the node's
