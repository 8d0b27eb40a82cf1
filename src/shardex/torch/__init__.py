"""PyTorch loading: a random-access dataset with a distributed sampler, and a streaming one.

Needs the ``torch`` extra (``pip install 'shardex[torch]'``); ``import shardex`` itself
never imports torch.

* :class:`MapDataset` + :class:`ShardexSampler`: one read per sample, a global shuffle in
  O(1) memory (:class:`IndexPermutation`), exactly equal shares per rank, resume.
* :class:`StreamDataset`: shard order, seeded shard shuffle and bounded buffer shuffle,
  exactly equal sample counts per rank, read-ahead of the next run of samples, resume.
* :class:`TensorShardsLoader`: batches from prefetched windows of whole shards (array
  backends, made for ``tensor_shards``), batch size independent of shard size, resume.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    from shardex.errors import MissingDependencyError

    raise MissingDependencyError(
        "shardex.torch needs PyTorch: pip install 'shardex[torch]'"
    ) from exc

# Every DataLoader worker seeds numpy.random as it starts, and numpy imports that module
# lazily; imported in a freshly forked worker, it can fail at random on CPython 3.11
# (KeyError in importlib's module lock, CPython issue 87712) and kill the worker. Import
# it here, before any worker is forked, so that workers find it loaded.
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
