from __future__ import annotations

from shardex.testing import BackendTests


class TestNumpyMmapBackend(BackendTests):
    backend_name = "numpy_mmap"
