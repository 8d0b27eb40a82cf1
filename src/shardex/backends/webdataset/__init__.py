"""The default backend, ``webdataset``: tar shards + Parquet sidecars + a random-access
index. The backend (:mod:`.backend`), its reader (:mod:`.reader`) and its verification
(:mod:`.verify`) live here; ``format/`` holds the leaf codecs they use."""

from shardex.backends.webdataset.backend import WebDatasetBackend
from shardex.backends.webdataset.names import second_hash, shard_stem

__all__ = ["WebDatasetBackend", "second_hash", "shard_stem"]
