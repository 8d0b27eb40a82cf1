"""Ordered parallel map over local processes (inline for one worker).

Results come in submission order, so the output does not depend on the worker count. A fork
server (no fork of a process running Arrow or obstore threads) starts workers that never
re-run the caller's ``__main__`` (an unguarded script would export again; ``python -`` and
notebooks have no file); work that needs ``__main__`` runs inline after a
:class:`~shardex.errors.ParallelismWarning`. Workers exit when their owner dies, even by
SIGKILL, and the forkserver and resource tracker follow.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import os
import pickle
import select
import signal
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from typing import Any, Self, TypeVar

from shardex.errors import ExportError, ParallelismWarning, mode_hint

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """One worker per available core, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def _warm(modules: tuple[str, ...]) -> None:
    for name in modules:
        importlib.import_module(name)


#: prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _exit_with(owner: int) -> None:
    """Exit when ``owner`` dies: a worker is the forkserver's child and holds its own
    queue's write end, so a killed owner would otherwise leave it running for ever."""
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


#: A fork server of shardex's own, so the caller's forkserver settings stay as they are.
_SERVER = forkserver.ForkServer()
_SERVER.set_forkserver_preload(["shardex.parallel"])


def start_server(preload: tuple[str, ...]) -> None:
    """Start the fork server now, importing ``preload``: the workers a pool starts later
    are forked ready, and this start-up overlaps the caller's own (a CLI export's imports)."""
    _SERVER.set_forkserver_preload(["shardex.parallel", *preload])
    with contextlib.suppress(Exception):  # none here: the pool says so when it starts
        _SERVER.ensure_running()


class _Popen(popen_forkserver.Popen):
    """popen_forkserver.Popen on :data:`_SERVER`, less the step that runs ``__main__``."""

    def _launch(self, process_obj: Any) -> None:  # pragma: no cover - the stdlib's, adapted
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_name", None)
        prep_data.pop("init_main_from_path", None)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = _SERVER.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        parent_w = os.dup(w)  # the child's sentinel of this process
        close = util.close_fds  # type: ignore[attr-defined]
        self.finalizer = util.Finalize(self, close, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)


class _Context(context.ForkServerContext):
    Process = _Process


@dataclass(frozen=True, slots=True)
class _Unreadable:
    reason: str


# In a worker: the initializer's unpickling error, if any (then every task is refused).
_init_error: str | None = None


def _start_worker(owner: int, init: bytes) -> None:
    global _init_error
    _exit_with(owner)
    try:
        initializer, initargs = pickle.loads(init)
    except Exception as exc:  # defined in the caller's __main__, or importable only there
        _init_error = f"{type(exc).__name__}: {exc}"
        return
    if initializer is not None:
        initializer(*initargs)


def _run_task(task: bytes) -> object:
    if _init_error is not None:
        return _Unreadable(_init_error)
    try:
        fn, item = pickle.loads(task)
    except Exception as exc:
        return _Unreadable(f"{type(exc).__name__}: {exc}")
    return fn(item)


class Runner:
    """Runs functions over items in order, on ``workers`` processes (inline for 1); work
    they cannot take runs inline after a :class:`ParallelismWarning`."""

    #: Whether work may run on another machine, without this one's memory or scratch.
    remote: bool = False

    def put(self, data: bytes) -> Any:
        """A handle of ``data`` in a remote runner's object store, for jobs to carry."""
        raise NotImplementedError(f"{type(self).__name__} keeps no objects for its jobs")

    def __init__(
        self,
        workers: int | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[object, ...] = (),
        preload: tuple[str, ...] = (),
    ) -> None:
        """``preload``: modules each worker imports as it starts (saves ~0.3 s per task)."""
        self.workers = default_workers() if workers is None else max(1, workers)
        self._preload = preload
        self._pool: ProcessPoolExecutor | None = None
        self._init = initializer
        self._initargs = initargs
        self._inline_ready = False

    def __enter__(self) -> Self:
        if self.workers == 1:
            self._run_inline_init()
            return self
        try:
            init = pickle.dumps((self._init, self._initargs))
        except Exception as exc:
            self._fall_back(f"its setup does not pickle ({type(exc).__name__}: {exc})")
            return self
        self._pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=_Context(),
            initializer=_start_worker,
            initargs=(os.getpid(), init),
        )
        # Start the workers now, so their start-up (~0.5 s) overlaps the caller's scan.
        try:
            for _ in range(self.workers):
                self._pool.submit(_warm, self._preload)
        except Exception as exc:  # no fork server here (a sandbox, an embedded Python)
            self._fall_back(
                f"worker processes cannot start ({type(exc).__name__}: {exc})",
                "workers=1 does the same without this warning",
            )
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._stop(cancel=exc_type is not None)

    def _stop(self, cancel: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None

    def _run_inline_init(self) -> None:
        if not self._inline_ready and self._init is not None:
            self._init(*self._initargs)
        self._inline_ready = True

    def _fall_back(
        self, why: str, hint: str = "define what it uses in an importable module to use workers"
    ) -> None:
        warnings.warn(
            f"running in this process instead of {self.workers} worker processes: {why}; {hint}",
            ParallelismWarning,
            stacklevel=4,
        )
        self._stop(cancel=True)
        self.workers = 1
        self._run_inline_init()

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``map(fn, items)`` in order; runs ahead by at most ``2 * workers`` items."""
        pending: deque[tuple[Future[object], T]] = deque()
        for item in items:
            future = self._submit(fn, item)
            if future is None:  # inline (from the start, or since a fall-back)
                while pending:
                    yield self._result(fn, *pending.popleft())
                yield fn(item)
                continue
            pending.append((future, item))
            if len(pending) >= 2 * self.workers:
                yield self._result(fn, *pending.popleft())
        while pending:
            yield self._result(fn, *pending.popleft())

    def _submit(self, fn: Callable[[T], R], item: T) -> Future[object] | None:
        if self._pool is None:
            return None
        try:
            task = pickle.dumps((fn, item))
        except Exception as exc:
            self._fall_back(f"its work does not pickle ({type(exc).__name__}: {exc})")
            return None
        try:
            return self._pool.submit(_run_task, task)
        except BrokenProcessPool as exc:
            raise _worker_died() from exc

    def _result(self, fn: Callable[[T], R], future: Future[object], item: T) -> R:
        if future.cancelled():  # dropped by a fall-back before a worker took it
            return fn(item)
        try:
            result = future.result()
        except BrokenProcessPool as exc:
            raise _worker_died() from exc
        if isinstance(result, _Unreadable):
            if self._pool is not None:
                self._fall_back(f"a worker process cannot load its work ({result.reason})")
            return fn(item)
        return result  # type: ignore[return-value]


def _worker_died() -> ExportError:
    return ExportError(
        "a worker process died (killed by a signal, or out of memory), so the run stopped "
        f"and committed nothing; run it again (an export: with {mode_hint('resume')}, which "
        "keeps the shards already written), with fewer workers if memory ran short"
    )
