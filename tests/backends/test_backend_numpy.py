from __future__ import annotations

from shardex.testing import BackendTests


class TestNumpyBackend(BackendTests):
    backend_name = "numpy"
    files_inside_shard_folders = True
