"""PyTorch loading: a random-access dataset with a distributed sampler, and a streaming one.

Needs the ``torch`` extra; ``import shardex`` itself never imports torch.
:class:`MapDataset` + :class:`ShardexSampler` (random access), :class:`StreamDataset`
(shard order, buffer shuffle) and :class:`TensorShardsLoader` (whole-shard windows) all
give exactly equal shares per rank and resume mid-epoch.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    from shardex.errors import MissingDependencyError

    raise MissingDependencyError(
        "shardex.torch needs PyTorch: pip install 'shardex[torch]'"
    ) from exc

# Workers seed numpy.random, which numpy imports lazily; importing it in a fresh fork can
# fail on CPython 3.11 (importlib lock KeyError, CPython issue 87712): load it before.
import numpy.random  # noqa: F401

from shardex.torch.batches import RowPacker, collate
from shardex.torch.map import MapDataset
from shardex.torch.permutation import IndexPermutation
from shardex.torch.sampler import ShardexSampler
from shardex.torch.stream import StreamDataset, StreamLoader
from shardex.torch.windows import TensorShardsLoader

__all__ = [
    "IndexPermutation",
    "MapDataset",
    "RowPacker",
    "ShardexSampler",
    "StreamDataset",
    "StreamLoader",
    "TensorShardsLoader",
    "collate",
]
