"""Ordered parallel map over local processes, or inline for one worker.

Results come back in submission order, so what is written does not depend on the number of
workers. Workers start with ``forkserver`` (no fork of a process that already runs Arrow
threads); at most ``2 * workers`` tasks are in flight, which bounds memory.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from types import TracebackType
from typing import Self, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """One worker per available core, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def _noop() -> None:
    pass


class Runner:
    """Runs functions over items in order, on ``workers`` processes (inline for 1)."""

    def __init__(
        self,
        workers: int | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[object, ...] = (),
    ) -> None:
        self.workers = default_workers() if workers is None else max(1, workers)
        self._pool: ProcessPoolExecutor | None = None
        self._init = initializer
        self._initargs = initargs

    def __enter__(self) -> Self:
        if self.workers == 1 and self._init is not None:
            self._init(*self._initargs)
        if self.workers > 1:
            ctx = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=ctx,
                initializer=self._init,
                initargs=self._initargs,  # type: ignore[arg-type]  # typeshed: tuple[()]
            )
            # Start the workers now (they start lazily), so that their start-up (~0.5 s)
            # overlaps with the caller's own work, such as scanning the source.
            for _ in range(self.workers):
                self._pool.submit(_noop)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=exc_type is not None)
            self._pool = None

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``map(fn, items)`` in order; runs ahead by at most ``2 * workers`` items."""
        if self._pool is None:
            yield from map(fn, items)
            return
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(self._pool.submit(fn, item))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
