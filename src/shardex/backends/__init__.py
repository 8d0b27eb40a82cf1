"""Export backends behind one contract, and their registry."""

from shardex.backends.base import Backend, Capabilities, ShardDone, SplitPlan, SplitWriter
from shardex.backends.registry import REGISTRY, BackendEntry, get_backend, register_backend

__all__ = [
    "REGISTRY",
    "Backend",
    "BackendEntry",
    "Capabilities",
    "ShardDone",
    "SplitPlan",
    "SplitWriter",
    "get_backend",
    "register_backend",
]
