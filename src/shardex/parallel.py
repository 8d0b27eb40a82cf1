"""Ordered parallel map over local processes, or inline for one worker.

Results come back in submission order, so what is written does not depend on the number of
workers. Workers start with ``forkserver`` (no fork of a process that already runs Arrow
threads); at most ``2 * workers`` tasks are in flight, which bounds memory.

Workers exit when the process that made the pool dies, even by SIGKILL: each watches it
(a pidfd on Linux, else a poll once a second). The forkserver and the resource tracker
then exit too, as they stay only while a process holds their pipes.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import select
import signal
import sys
import threading
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


#: prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _exit_with(owner: int) -> None:
    """Make this worker exit when process ``owner`` (the pool's creator) dies.

    A pool worker is a child of the forkserver, not of its owner, and blocks on a queue
    whose write end it holds itself: without this, a killed owner leaves its workers (and
    through them the forkserver and the resource tracker) running for ever.
    """
    if sys.platform == "linux":  # the forkserver dying takes its children with it
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    threading.Thread(target=_watch, args=(owner,), daemon=True, name="shardex-owner").start()


def _watch(owner: int) -> None:
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:  # already gone
        os._exit(1)
    except (OSError, AttributeError):  # no pidfd (not Linux, or before 5.3): poll
        while True:
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os._exit(1)
            except OSError:
                pass
            threading.Event().wait(1.0)
    select.select([fd], [], [])  # readable once the process has exited
    os._exit(1)


def _start_worker(
    owner: int, initializer: Callable[..., object] | None, initargs: tuple[object, ...]
) -> None:
    _exit_with(owner)
    if initializer is not None:
        initializer(*initargs)


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
                initializer=_start_worker,
                initargs=(os.getpid(), self._init, self._initargs),
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
