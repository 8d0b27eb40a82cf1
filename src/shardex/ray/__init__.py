"""Ray Data: read a shardex export as a Ray Dataset, write a Ray Dataset as an export.

Needs the ``ray`` extra; ``import shardex`` itself never imports Ray.
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
