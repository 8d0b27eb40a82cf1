from __future__ import annotations

from shardex.testing import BackendTests


class TestTensorShardsBackend(BackendTests):
    backend_name = "tensor_shards"
