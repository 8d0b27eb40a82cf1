from __future__ import annotations

from shardex.testing import BackendTests


class TestNumpyBackend(BackendTests):
    backend_name = "numpy"
