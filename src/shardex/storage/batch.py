"""Batches of ranged reads on object storage: how many requests are in flight, and hedging.

A batch waits for its slowest request, and on S3 the slowest 1-5% of requests take several
times the median, so nearly every batch of 64 meets one. A request that has waited 1.2x
the 95th percentile of the latencies seen so far gets a second, identical ranged GET, and
a third if both wait as long again (a hedge can meet the tail too); the first answer wins
and the others are cancelled. Hedges are capped at ``budget`` of the requests sent (5% by
default), and counted in :data:`read_stats`. A full garbage collection (tens of ms for a
large heap) stops every thread, the I/O loop's too: a request it overlapped waits 10 ms
more before it is hedged (its answer may have come meanwhile), and its latency is not
recorded, or one collection would look like a slow batch, spend the budget and raise
the threshold.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import gc
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from shardex.per_process import PerProcess

T = TypeVar("T")

#: Requests of one batch in flight at once, per process, unless the storage option
#: ``read_concurrency`` says otherwise: a DataLoader batch of 64 samples in one round trip.
DEFAULT_CONCURRENCY: Final = 64
#: Latencies a process remembers to place its hedging threshold.
_WINDOW: Final = 512
#: Latencies needed before any request is hedged.
_WARMUP: Final = 64
#: Requests sent for one range at most: the first and two hedges.
_ATTEMPTS: Final = 3
#: Seconds a request waits after a full collection before it is hedged.
_GRACE: Final = 0.01
#: Seconds a process waits at exit for its requests in flight to end (see :class:`_Loop`).
_SETTLE: Final = 10.0
#: Seconds after a request ended (or was cancelled) for the native thread that ran it to
#: leave Python.
_AFTER: Final = 0.05
#: Full garbage collections this process has started (the younger ones take microseconds).
_collections = [0]


def _count_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start" and info["generation"] == 2:
        _collections[0] += 1


gc.callbacks.append(_count_collection)

Fetch = Callable[[str, int, int], Awaitable[bytes]]


@dataclass
class ReadStats:
    """What this process's batched ranged reads did (read it as :data:`read_stats`)."""

    #: Ranged GETs sent for batches, hedges included.
    requests: int = 0
    #: Second GETs sent for requests slower than the hedging threshold.
    hedged: int = 0
    #: Hedges that answered before the request they doubled.
    hedges_won: int = 0
    #: Recent request latencies, in seconds.
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW), repr=False)
    _threshold: float | None = field(default=None, repr=False)
    _since: int = field(default=0, repr=False)

    def record(self, seconds: float) -> None:
        self.latencies.append(seconds)
        self._since += 1
        if self._since >= 32 or self._threshold is None:
            self._since = 0
            if len(self.latencies) >= _WARMUP:
                ordered = sorted(self.latencies)
                # a fifth above the 95th percentile: a request that is merely slowish
                # (jitter around a steady latency) is not sent twice
                self._threshold = ordered[int(len(ordered) * 0.95)] * 1.2

    def threshold(self) -> float | None:
        """Seconds after which a request is hedged; None until enough were seen."""
        return self._threshold

    def reset(self, *, latencies: bool = False) -> None:
        """Zero the counters (and forget the latencies seen: ``latencies``)."""
        self.requests = self.hedged = self.hedges_won = 0
        if latencies:
            self.latencies.clear()
            self._threshold, self._since = None, 0


#: This process's batched-read counters (a forked worker starts from its parent's).
read_stats: Final = ReadStats()


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How a storage runs a batch: ``concurrency`` requests in flight at most, hedged
    (``hedge``) within ``budget`` extra requests per request sent."""

    concurrency: int = DEFAULT_CONCURRENCY
    hedge: bool = True
    budget: float = 0.05


async def fetch_all(
    fetch: Fetch, requests: Sequence[tuple[str, int, int]], policy: BatchPolicy
) -> list[bytes]:
    """Every ``(path, start, length)`` through ``fetch``, at most ``policy.concurrency``
    at a time, slow ones hedged; the results in the order asked."""
    limit = asyncio.Semaphore(max(1, policy.concurrency))

    async def one(path: str, start: int, length: int) -> bytes:
        async with limit:
            began, collected = time.perf_counter(), _collections[0]
            read_stats.requests += 1
            wait = read_stats.threshold() if policy.hedge else None
            if wait is None:
                data = await fetch(path, start, length)
            else:
                data = await _hedged(fetch, (path, start, length), wait, policy.budget)
            if _collections[0] == collected:  # else its time was partly the collection's
                read_stats.record(time.perf_counter() - began)
            return data

    return list(await asyncio.gather(*(one(*r) for r in requests)))


async def _hedged(fetch: Fetch, request: tuple[str, int, int], wait: float, budget: float) -> bytes:
    """The first good answer among a request and up to two hedges, each sent once the
    requests before it have waited ``wait`` seconds (a hedge can meet the tail too)."""
    stats = read_stats
    first = asyncio.ensure_future(fetch(*request))
    tasks, sent, error, timeout = {first}, 1, None, wait
    while True:
        collected = _collections[0]
        done, tasks = await asyncio.wait(
            tasks,
            timeout=timeout if sent < _ATTEMPTS else None,
            return_when=asyncio.FIRST_COMPLETED,
        )
        for task in done:
            if task.exception() is None:
                for other in tasks:
                    other.cancel()
                if task is not first:
                    stats.hedges_won += 1
                return task.result()
            error = error or task.exception()
        if not done and _collections[0] != collected:  # the process stood still: answers that
            timeout = min(wait, _GRACE)  # came meanwhile are let in before any hedge
            continue
        timeout = wait
        if not done and stats.hedged < budget * stats.requests:  # waited too long: hedge
            stats.requests += 1
            stats.hedged += 1
            sent += 1
            tasks.add(asyncio.ensure_future(fetch(*request)))
        elif not done:  # no budget left: wait for what was sent
            sent = _ATTEMPTS
        elif not tasks:
            assert error is not None
            raise error


class _Loop:
    """One event loop per process on a daemon thread, for batches of concurrent reads.

    obstore's requests end on its own threads, which then call into Python to hand the
    answer over (or to see that it was cancelled); one doing so while the interpreter is
    torn down at exit aborted the process (SIGABRT) or printed a panic. So each request is
    :meth:`tracked` until it ends or is cancelled, and at exit the process waits for those
    in flight (:meth:`settle`).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.in_flight: set[asyncio.Future[Any]] = set()  # changed on the loop's thread only
        self.last_end = 0.0
        self.pid = os.getpid()
        threading.Thread(
            target=self.loop.run_forever, daemon=True, name="shardex-object-io"
        ).start()
        atexit.register(self.settle)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def tracked(self, request: Awaitable[T]) -> asyncio.Future[T]:
        """``request`` (a future of a native library's, on this loop), counted in flight
        until it ends or is cancelled."""
        future = asyncio.ensure_future(request)
        self.in_flight.add(future)
        future.add_done_callback(self._ended)
        return future

    def _ended(self, future: asyncio.Future[Any]) -> None:
        self.in_flight.discard(future)
        self.last_end = time.monotonic()
        if not future.cancelled():
            future.exception()  # retrieved: an error no one awaits any more is not logged

    def settle(self) -> None:
        """At exit: wait for the requests in flight (up to :data:`_SETTLE` seconds), then
        :data:`_AFTER` past the last one to end or be cancelled, for its thread to leave
        Python."""
        if os.getpid() != self.pid:  # a forked child's copy: its requests are not here
            return
        deadline = time.monotonic() + _SETTLE
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(max(0.0, self.last_end + _AFTER - time.monotonic()))


event_loop: Final = PerProcess(_Loop)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` run on this process's I/O loop; its result."""
    return event_loop().submit(coro).result()
