"""``RayExecutor``: the same pipeline on a Ray cluster, byte-identical to local runs.

Stages run in Ray actors (in order, through ``ray.util.ActorPool``); the export's own
parallel work runs as Ray tasks.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self, TypeVar

from shardex.errors import imported
from shardex.parallel import Runner
from shardex.pipeline.executors import Executor, run_stages
from shardex.pipeline.readers import BatchJob
from shardex.pipeline.stage import Batch, Stage

T = TypeVar("T")
R = TypeVar("R")


def _ray() -> Any:
    return imported("ray", "RayExecutor needs Ray: pip install 'shardex[ray]'")


class _StageActor:
    """Holds a set-up stage chain; runs batches through it."""

    def __init__(self, stages: list[Stage]) -> None:
        self.stages = stages  # Ray hands each actor its own copy
        for stage in self.stages:
            stage.setup()

    def run(self, job: BatchJob) -> tuple[int, Batch]:
        return run_stages(self.stages, job)

    def close(self) -> None:
        for stage in self.stages:
            stage.teardown()


def _call(fn: Callable[[T], R], item: T) -> R:
    return fn(item)


def _call_kept(fn: Callable[[T], Iterator[object]], item: T) -> Iterator[object]:
    # a generator task: Ray stores each object it yields
    yield from fn(item)


class RayRunner(Runner):
    """The exporter's ordered parallel map as Ray tasks on any node.

    At most 2 per cluster CPU (or ``limit``) are in flight, which bounds memory.
    """

    remote = True

    def __init__(self, executor: RayExecutor, limit: int | None = None) -> None:
        super().__init__(1)
        self._executor = executor
        self._limit = limit
        self._ahead = 2
        self._pending: deque[Any] = deque()
        self._store = 0

    def __enter__(self) -> Self:
        self._executor.connect()
        resources = _ray().cluster_resources()
        cpus = max(1, int(resources.get("CPU", 1)))
        self._store = int(resources.get("object_store_memory", 0))
        # Ray runs every task a CPU is free for: ``limit`` is kept by giving fewer; else
        # two per CPU in flight, so a CPU never waits for the next task
        limit = self._limit
        if limit is not None and limit < cpus:
            self.workers = self._ahead = max(1, limit)
        else:
            self.workers, self._ahead = cpus, 2 * cpus
        return self

    def __exit__(self, *exc: object) -> None:
        self._settle()

    def _settle(self) -> None:
        """Cancel or await every task, so none writes after a failed export gave up the lock."""
        pending, self._pending = list(self._pending), deque()
        if not pending:
            return
        ray = _ray()
        for ref in pending:
            with contextlib.suppress(Exception):  # already finished, or already failed
                ray.cancel(ref)
        ray.wait(pending, num_returns=len(pending), fetch_local=False)
        for ref in pending:  # a generator task is ready at its next object: to its end
            if isinstance(ref, ray.ObjectRefGenerator):
                with contextlib.suppress(Exception):
                    for _ in ref:
                        pass

    def put(self, data: bytes) -> Any:
        """``data`` in this node's object store, owned by this process (survives workers)."""
        return _ray().put(data)

    def store_bytes(self) -> int:
        """The cluster's object store memory (all nodes), when entered."""
        return self._store

    def imap_kept(
        self, fn: Callable[[T], Iterator[object]], items: Iterable[T]
    ) -> Iterator[tuple[object, tuple[Any, ...]]]:
        """:meth:`imap` of generator functions: yielded objects stay on their node (refs here)."""
        ray = _ray()

        def kept(objects: Any) -> tuple[object, tuple[Any, ...]]:
            refs = list(objects)  # as the task yields them, to its end
            return ray.get(refs[-1]), tuple(refs[:-1])

        return self._ordered(ray.remote(num_cpus=1)(_call_kept), fn, items, kept)

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        ray = _ray()
        return self._ordered(ray.remote(num_cpus=1)(_call), fn, items, ray.get)

    def _ordered(
        self, task: Any, fn: Any, items: Iterable[Any], result: Callable[[Any], R]
    ) -> Iterator[R]:
        """``result`` of ``task.remote(fn, item)`` per item, in order, ``_ahead`` in flight."""
        pending = self._pending = deque()
        for item in items:
            pending.append(task.remote(fn, item))
            if len(pending) >= self._ahead:
                yield result(pending.popleft())
        while pending:
            yield result(pending.popleft())


class RayExecutor(Executor):
    """Run on Ray: ``address=None`` starts (or joins) a local cluster, ``"auto"`` joins the
    running one, ``"ray://host:10001"`` a remote one.

    Args:
        address: where the cluster is (see ``ray.init``).
        actors: stage actors (default: as many as the cluster's CPUs allow).
        init_options: more ``ray.init`` keyword arguments (``num_cpus`` ...).
    """

    kind = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        actors: int | None = None,
        init_options: dict[str, Any] | None = None,
    ) -> None:
        self.address = address
        self.actors = actors
        self.init_options = dict(init_options or {})
        self._started = False

    def connect(self) -> None:
        from shardex.pipeline import ray_connect

        self._started = ray_connect.init(_ray(), self.address, self.init_options) or self._started

    def close(self) -> None:
        """Shut Ray down if :meth:`connect` started it."""
        started, self._started = self._started, False
        if started:
            _ray().shutdown()

    def map_batches(self, stages: list[Stage], jobs: Iterable[BatchJob]) -> Iterator[Batch]:
        ray = _ray()
        self.connect()
        cpus = max([s.resources.cpus for s in stages] or [1.0])
        gpus = max([s.resources.gpus for s in stages] or [0.0])
        count = self.actors or max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
        actor = ray.remote(num_cpus=cpus, num_gpus=gpus)(_StageActor)
        actors = [actor.remote(stages) for _ in range(count)]
        try:
            pool = ray.util.ActorPool(actors)
            for _, batch in pool.map(lambda a, job: a.run.remote(job), jobs):
                yield batch
            ray.get([a.close.remote() for a in actors])
        finally:
            for a in actors:
                ray.kill(a)

    def runner(self) -> Runner:
        return RayRunner(self)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.kind, "address": self.address}
