from __future__ import annotations

from shardex.testing import BackendTests


class TestWebDatasetBackend(BackendTests):
    backend_name = "webdataset"
