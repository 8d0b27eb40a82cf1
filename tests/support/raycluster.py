"""A real local Ray cluster that listens on loopback only (tests and benchmarks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables (which Ray's processes inherit) and restore them after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextmanager
def local_ray_cluster(num_cpus: int = 2, **init_options: Any) -> Iterator[None]:
    """Start a local Ray cluster on 127.0.0.1, yield, shut it down.

    Ray replaces ``127.0.0.1`` with the machine's address unless it believes it runs on a
    laptop (an OSX/Windows default); with that switch off every service listens on
    loopback only, which the tests check.
    """
    from ray._private import ray_constants

    import ray

    # Ray's workers import the tests' stages (tests.support.stages) by name: they need the
    # repository root on their path, also when the driver runs from another directory.
    python_path = os.pathsep.join([_REPO_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    # a cluster of its own: ray.init() without an address joins one that `ray start` left
    # running on this machine (another test run's, a benchmark's), which then refuses num_cpus
    init_options.setdefault("address", "local")
    try:
        with environ(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONPATH=python_path):
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                object_store_memory=init_options.pop("object_store_memory", 150 * 1024**2),
                log_to_driver=False,
                **init_options,
            )
            try:
                nodes = {n["NodeManagerAddress"] for n in ray.nodes()}  # type: ignore[no-untyped-call]
                if nodes != {"127.0.0.1"}:
                    raise RuntimeError(f"Ray listens on {nodes}, not on loopback only")
                yield
            finally:
                ray.shutdown()
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag


@contextmanager
def ray_nodes(
    nodes: int = 2, cpus_per_node: int = 1, object_store_memory: int = 80 << 20
) -> Iterator[Any]:
    """A real Ray cluster of ``nodes`` nodes (a raylet and an object store of
    ``object_store_memory`` bytes each, as ``ray.cluster_utils.Cluster`` starts them) on
    127.0.0.1, this process its driver; yields the cluster, shuts it down. Tasks run on
    every node, the head's included.
    """
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    import ray

    python_path = os.pathsep.join([_REPO_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    common: dict[str, Any] = {
        "node_ip_address": "127.0.0.1",
        "object_store_memory": object_store_memory,
        "include_dashboard": False,
    }
    try:
        with environ(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONPATH=python_path):
            cluster = Cluster(
                initialize_head=True,
                head_node_args={**common, "num_cpus": cpus_per_node},
            )
            try:
                for _ in range(nodes - 1):
                    cluster.add_node(**{**common, "num_cpus": cpus_per_node})
                cluster.wait_for_nodes()
                ray.init(address=cluster.address, log_to_driver=False)
                try:
                    alive = [n for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]
                    if {n["NodeManagerAddress"] for n in alive} != {"127.0.0.1"}:
                        raise RuntimeError("Ray listens on more than loopback")
                    if len(alive) != nodes:
                        raise RuntimeError(f"{len(alive)} Ray nodes alive, not {nodes}")
                    yield cluster
                finally:
                    ray.shutdown()
            finally:
                cluster.shutdown()  # type: ignore[no-untyped-call]
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag


def record_span(arg: tuple[str, int]) -> int:
    """A task that sleeps a little and records when it ran, as ``FOLDER/I``: ``start end``
    (monotonic clock, the same on every node of a cluster on one machine)."""
    import time

    folder, i = arg
    start = time.monotonic()
    time.sleep(0.3)
    Path(folder, f"{i}").write_text(f"{start} {time.monotonic()}")
    return i


def slice_read(part: Any) -> tuple[list[str], list[int], int]:
    """In a Ray task: a spill slice's keys and planned sizes, and the task's process id."""
    rows, _, sizes = part.read_sized()
    assert sizes is not None
    return rows.column("key").to_pylist(), sizes.tolist(), os.getpid()
