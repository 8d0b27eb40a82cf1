"""A split's shard lists for wids (``shards.wids.json``) and webdataset (``shards.txt``),
naming tars relative to their folder so a moved export keeps working lists."""

from __future__ import annotations

import json
from typing import Final

from shardex.contract import ExportConfig

WIDS_FILE: Final = "shards.wids.json"  # wids-shard-index-v1, as widsindex writes
LIST_FILE: Final = "shards.txt"


def shard_lists(config: ExportConfig, split: str) -> dict[str, bytes]:
    """A split's two list files (none without shards: wids refuses an empty list)."""
    prefix = config.split_prefix(split)
    shards = config.split(split).shards
    if not shards:
        return {}
    names = [s.path.removeprefix(prefix) for s in shards]
    index = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": split,
        "shardlist": [
            {"url": name, "nsamples": s.num_samples, "filesize": s.num_bytes}
            for name, s in zip(names, shards, strict=True)
        ],
    }
    return {
        f"{prefix}{WIDS_FILE}": (json.dumps(index, indent=1) + "\n").encode(),
        f"{prefix}{LIST_FILE}": "".join(f"{name}\n" for name in names).encode(),
    }
