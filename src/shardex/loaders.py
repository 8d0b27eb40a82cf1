"""The data loaders that read an export (``shardex backend list data-loader``), each
naming the backend capability it relies on, never backend names.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from shardex.backends.base import Capabilities


@dataclass(frozen=True, slots=True)
class LoaderInfo:
    name: str
    target: str
    requires: tuple[str, ...]
    install_hint: str
    #: The :class:`Capabilities` field a backend must have; None: any backend.
    needs: str | None
    description: str

    @property
    def available(self) -> bool:
        """Whether its optional dependencies are importable (not imported)."""
        return all(_importable(mod) for mod in self.requires)

    def backends(self, capabilities: Mapping[str, Capabilities]) -> tuple[str, ...]:
        return tuple(
            name
            for name, caps in capabilities.items()
            if self.needs is None or getattr(caps, self.needs)
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


_TORCH: Final = "pip install 'shardex[torch]'"

LOADERS: Final[tuple[LoaderInfo, ...]] = (
    LoaderInfo(
        "MapDataset",
        "shardex.torch:MapDataset",
        ("torch",),
        _TORCH,
        "random_access",
        "one read per sample; with ShardexSampler: global shuffle in O(1) memory, equal "
        "shares per rank, resume (state_dict)",
    ),
    LoaderInfo(
        "StreamDataset",
        "shardex.torch:StreamDataset",
        ("torch",),
        _TORCH,
        "streaming",
        "shard order, seeded shard shuffle and bounded buffer shuffle, equal sample counts "
        "per rank, read-ahead, resume",
    ),
    LoaderInfo(
        "TensorShardsLoader",
        "shardex.torch:TensorShardsLoader",
        ("torch",),
        _TORCH,
        "shard_windows",
        "batches from prefetched windows of whole shards, batch size independent of shard "
        "size, resume",
    ),
    LoaderInfo(
        "DALI",
        "shardex.dali:pipeline",
        ("nvidia.dali",),
        "pip install 'shardex[dali]'",
        "dali",
        "NVIDIA DALI webdataset reader with the export's index files; GPU decoding, "
        "sharded across ranks",
    ),
    LoaderInfo(
        "Ray",
        "shardex.ray:read_shardex",
        ("ray",),
        "pip install 'shardex[ray]'",
        None,
        "a Ray Dataset, one row per sample in sample order; read tasks of whole shards",
    ),
)
