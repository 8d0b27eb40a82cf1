"""``RayExecutor``: the same pipeline on a Ray cluster.

Stages run in a pool of Ray actors (each sets the stage chain up once, with the largest
CPU and GPU needs among the stages as its Ray resources); batches go out in order through
``ray.util.ActorPool`` and come back in order. The export's own parallel work (checking
samples, writing whole shards under deterministic names) runs as Ray tasks; the driver
commits config.yaml. Output is byte-identical to :class:`LocalExecutor`'s.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self, TypeVar

from shardex.errors import MissingDependencyError
from shardex.parallel import Runner
from shardex.pipeline.executors import Executor, run_stages
from shardex.pipeline.readers import BatchJob
from shardex.pipeline.stage import Batch, Stage

T = TypeVar("T")
R = TypeVar("R")


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError("RayExecutor needs Ray: pip install 'shardex[ray]'") from exc
    return ray


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
    # a generator task: Ray stores each object it yields (and sends values in: ``fn``
    # is a generator function, whose generators take them)
    yield from fn(item)


class RayRunner(Runner):
    """The exporter's ordered parallel map as Ray tasks (at most 2 per cluster CPU in
    flight, which bounds memory; ``limit`` tasks at most, when given). Tasks may run on any node: jobs carry what they read
    (reference rows, never sample bytes), and write straight to the output storage."""

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
        # ``limit``: the export's ``workers``, at most that many tasks at once (Ray runs
        # every task it is given that a CPU is free for: fewer are given); else two per
        # CPU in flight, so a CPU never waits for the next task
        limit = self._limit
        if limit is not None and limit < cpus:
            self.workers = self._ahead = max(1, limit)
        else:
            self.workers, self._ahead = cpus, 2 * cpus
        return self

    def __exit__(self, *exc: object) -> None:
        self._settle()

    def _settle(self) -> None:
        """Cancel the tasks not started and wait for the rest: when a shard fails, the
        export undoes this run's files and gives the output's lock back only after this,
        so no task still in flight writes a shard into the output afterwards."""
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
        """``data`` in the object store of this process's node (its primary copy, owned
        by this process: a worker node that dies does not take it)."""
        return _ray().put(data)

    def store_bytes(self) -> int:
        """The cluster's object store memory (all nodes), when entered."""
        return self._store

    def imap_kept(
        self, fn: Callable[[T], Iterator[object]], items: Iterable[T]
    ) -> Iterator[tuple[object, tuple[Any, ...]]]:
        """:meth:`imap` of generator functions (see
        :class:`shardex.sources.base.KeepingRunner`): each object a task yields before
        its result is stored on the task's node, owned by this process (lost with its
        node, Ray makes it again by running the task again); only its ref comes here."""
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
        """``task.remote(fn, item)`` for each item, at most ``_ahead`` in flight, and
        each one's ``result``, in order."""
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
        """Join (or start) the cluster unless this process already has (an address where
        no cluster answers: ClusterUnreachableError within seconds, see ray_connect)."""
        from shardex.pipeline import ray_connect

        self._started = ray_connect.init(_ray(), self.address, self.init_options) or self._started

    def close(self) -> None:
        """Shut Ray down if :meth:`connect` started it; a Ray the caller had initialised
        stays."""
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
