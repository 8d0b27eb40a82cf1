"""A split's remote shards and index files staged in a local folder, for DALI, whose own
S3 client sees only the environment, not shardex's storage options. A killed run's folder
is removed by the next staging (its ``.lock`` is free).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from shardex.contract import ShardInfo
from shardex.storage import Storage

PREFIX: Final = "shardex-dali-"
_THREADS: Final = 8


class Staging:
    """A locked local folder holding ``shards`` and their index files."""

    def __init__(self, storage: Storage, shards: Sequence[ShardInfo]) -> None:
        from shardex.storage.scratch import locked_folder, remove_stale

        root = Path(tempfile.gettempdir())
        remove_stale(root, PREFIX)
        self.path, lock = locked_folder(root, PREFIX, "split")
        self._lock: int | None = lock
        paths = [s.path for s in shards] + [s.dali_index for s in shards if s.dali_index]
        try:
            with ThreadPoolExecutor(min(_THREADS, max(1, len(paths)))) as pool:
                list(pool.map(lambda p: self._download(storage, p), paths))
        except BaseException:
            self.close()
            raise

    def _download(self, storage: Storage, path: str) -> None:
        target = self.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            for chunk in storage.iter_chunks(path):
                out.write(chunk)

    def close(self) -> None:
        """Remove the folder (idempotent)."""
        if self._lock is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._lock)
            self._lock = None
