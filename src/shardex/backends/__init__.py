"""Export backends behind one contract, and their registry."""

from shardex.backends.base import Backend, Capabilities, SplitPlan
from shardex.backends.registry import REGISTRY, BackendEntry, get_backend, register_backend

__all__ = [
    "REGISTRY",
    "Backend",
    "BackendEntry",
    "Capabilities",
    "SplitPlan",
    "get_backend",
    "register_backend",
]
