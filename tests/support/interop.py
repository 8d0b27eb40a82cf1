"""What other libraries read of an export: the stock ``webdataset`` reader over shards
(shardex's own interop tests; a third party needs none of it, so it is not shipped)."""

from __future__ import annotations

from typing import Any


def read_with_webdataset(urls: list[str]) -> list[dict[str, Any]]:
    """Every sample of some shards as the stock ``webdataset`` library returns them.

    webdataset leaves the last shard's file to the garbage collector; it is collected here
    with ResourceWarning silenced, so ``filterwarnings = error`` test runs stay clean.
    """
    import gc
    import warnings

    import webdataset as wds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        samples = [
            {k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")}
            for s in wds.WebDataset(urls, shardshuffle=False)
        ]
        gc.collect()
    return samples
