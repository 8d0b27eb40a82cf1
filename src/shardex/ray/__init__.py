"""Ray Data: read a shardex export as a Ray Dataset, write a Ray Dataset as an export.

Needs the ``ray`` extra (``pip install 'shardex[ray]'``); ``import shardex`` itself never
imports Ray.

* :func:`read_shardex` / :class:`ShardexDatasource`: one row per sample, in sample order;
  each read task reads a contiguous run of whole shards.
* :func:`write_shardex` / :class:`ShardexDatasink`: write tasks stage their rows, the driver
  exports them in order with :func:`shardex.export` and commits ``config.yaml`` last.
"""

from __future__ import annotations

try:
    import ray.data  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    from shardex.errors import MissingDependencyError

    raise MissingDependencyError("shardex.ray needs Ray Data: pip install 'shardex[ray]'") from exc

from shardex.ray.read import ShardexDatasource, read_shardex
from shardex.ray.write import ShardexDatasink, write_shardex

__all__ = ["ShardexDatasink", "ShardexDatasource", "read_shardex", "write_shardex"]
