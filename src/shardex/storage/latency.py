"""A storage whose ranged reads answer late, as an object store's do: to size
``read_concurrency``, workers and batches for a given latency, and to measure hedging,
where a loopback server would be the bottleneck (as zarr's ``LatencyStore`` wraps a store).

    slow = LatencyStorage(MemoryStorage("memory://bench/export"), delay=0.040,
                          tail=0.02, tail_delay=0.300)
    ds = shardex.open_dataset(slow)

Every ranged read waits ``delay`` seconds; a ``tail`` fraction of them (drawn at random,
seeded per process) waits ``tail_delay`` more. Batches run through the same concurrency
and hedging as object storage (:mod:`shardex.storage.batch`). Other calls go straight to
the wrapped storage. :attr:`LatencyStorage.gets` and :attr:`LatencyStorage.bytes_read`
count this process's reads (whole and ranged).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from shardex.storage.base import BatchedStorage, Forwarded, Storage
from shardex.storage.batch import BatchPolicy, fetch_all

__all__ = ["LatencyStorage"]


class LatencyStorage(BatchedStorage):
    """``inner``, its ranged reads answering after ``delay`` (+ ``tail_delay`` for a
    ``tail`` fraction of them) seconds; batches run by ``policy``."""

    def __init__(
        self,
        inner: Storage,
        delay: float = 0.0,
        *,
        tail: float = 0.0,
        tail_delay: float = 0.0,
        policy: BatchPolicy | None = None,
        seed: int = 0,
    ) -> None:
        self.inner, self.uri, self.coalesce_gap = inner, inner.uri, inner.coalesce_gap
        self.delay, self.tail, self.tail_delay = delay, tail, tail_delay
        self.policy = policy or BatchPolicy()
        self.seed = seed
        self.gets = self.bytes_read = 0
        self._random: random.Random | None = None
        self._pid = -1

    def __repr__(self) -> str:
        return f"LatencyStorage({self.inner!r}, delay={self.delay})"

    def _wait(self) -> float:
        if self._random is None or self._pid != os.getpid():  # a fresh draw per worker
            self._random, self._pid = (
                random.Random(self.seed * 1_000_003 + os.getpid()),
                os.getpid(),
            )
        self.gets += 1
        tail = self.tail_delay if self._random.random() < self.tail else 0.0
        return self.delay + tail

    def _counted(self, data: bytes) -> bytes:
        self.bytes_read += len(data)
        return data

    def get_range(self, path: str, start: int, length: int) -> bytes:
        time.sleep(self._wait())
        return self._counted(self.inner.get_range(path, start, length))

    def get(self, path: str) -> bytes:
        time.sleep(self._wait())
        return self._counted(self.inner.get(path))

    async def _batch(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        async def fetch(path: str, start: int, length: int) -> bytes:
            await asyncio.sleep(self._wait())
            return self._counted(self.inner.get_range(path, start, length))

        return await fetch_all(fetch, requests, self.policy)

    # everything but ranged and whole reads: the wrapped storage's own, on time
    iter_chunks = Forwarded("inner")
    size = Forwarded("inner")
    exists = Forwarded("inner")
    list = Forwarded("inner")
    list_pages = Forwarded("inner")
    delete = Forwarded("inner")
    put = Forwarded("inner")
    open_writer = Forwarded("inner")
    get_tagged = Forwarded("inner")
    put_if = Forwarded("inner")

    def local_path(self, path: str) -> Any:
        return None  # read as object storage is, whatever the wrapped storage
