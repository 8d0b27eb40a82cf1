"""The names of a split's tar shards."""

from __future__ import annotations

import xxhash


def shard_stem(prefix: str, name_hash: str, number: int) -> str:
    """``{prefix}images-{hash}-{NNNNNN}``: a shard's path without its extension."""
    return f"{prefix}images-{name_hash}-{number:06d}"


def second_hash(name_hash: str) -> str:
    """The name hash of a shard's second name."""
    return xxhash.xxh3_64(f"{name_hash}/2".encode()).hexdigest()[:12]
