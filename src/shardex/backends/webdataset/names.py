"""The names of a split's tar shards: ``{prefix}images-{hash}-{NNNNNN}``, with a second
hash for a shard's second name (see :mod:`shardex.backends.webdataset.split`)."""

from __future__ import annotations

import xxhash


def shard_stem(prefix: str, name_hash: str, number: int) -> str:
    """``{prefix}images-{hash}-{NNNNNN}`` (``prefix``: ``S/``, or ``""`` in the flat
    layout): the path of a shard without its extension."""
    return f"{prefix}images-{name_hash}-{number:06d}"


def second_hash(name_hash: str) -> str:
    """The name hash of a shard's second name (see :func:`_job`)."""
    return xxhash.xxh3_64(f"{name_hash}/2".encode()).hexdigest()[:12]
