"""Shard lists of a split, for readers that take a list of tars instead of a glob::

    S/shards.wids.json    wids' shard index: wids.ShardListDataset("out/S/shards.wids.json")
    S/shards.txt          one tar name per line, for webdataset.WebDataset([...])

Both name the tars relative to their own folder (wids resolves a relative ``url`` against
the folder of the JSON file it loaded), so an export that is moved or copied, locally or to
object storage, keeps working lists. They follow from config.yaml alone, and the engine
writes them around the commit (:func:`shardex.engine.commit.commit`).
"""

from __future__ import annotations

import json
from typing import Final

from shardex.contract import ExportConfig

#: wids' shard index (the ``wids-shard-index-v1`` format its ``widsindex`` tool writes).
WIDS_FILE: Final = "shards.wids.json"
#: The tar names, one a line.
LIST_FILE: Final = "shards.txt"


def shard_lists(config: ExportConfig, split: str) -> dict[str, bytes]:
    """``{prefix}shards.wids.json`` and ``{prefix}shards.txt`` of a split (none for a split
    without shards: wids refuses an empty list)."""
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
