"""Export backends behind one contract, and their registry.

A backend whose shards are each one file of a run's columns builds on
:class:`OneFileBackend` and :class:`OneFileDataset` (imported on first use: they load
pyarrow, which opening an export does not need)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardex.backends.base import Backend, Capabilities, ShardDone, SplitPlan, SplitWriter
from shardex.backends.registry import REGISTRY, BackendEntry, get_backend, register_backend

if TYPE_CHECKING:
    from shardex.backends.one_file import OneFileBackend, OneFileDataset

__all__ = [
    "REGISTRY",
    "Backend",
    "BackendEntry",
    "Capabilities",
    "OneFileBackend",
    "OneFileDataset",
    "ShardDone",
    "SplitPlan",
    "SplitWriter",
    "get_backend",
    "register_backend",
]


def __getattr__(name: str) -> Any:
    if name in ("OneFileBackend", "OneFileDataset"):
        from shardex.backends import one_file

        return getattr(one_file, name)
    raise AttributeError(f"module 'shardex.backends' has no attribute {name!r}")
