"""A real local Ray cluster that listens on loopback only (tests and benchmarks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def local_ray_cluster(num_cpus: int = 2, **init_options: Any) -> Iterator[None]:
    """Start a local Ray cluster on 127.0.0.1, yield, shut it down.

    Ray replaces ``127.0.0.1`` with the machine's address unless it believes it runs on a
    laptop (an OSX/Windows default); with that switch off every service listens on
    loopback only, which the tests check.
    """
    import ray
    from ray._private import ray_constants

    saved_env = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
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
        if saved_env is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = saved_env
