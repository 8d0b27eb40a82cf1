from __future__ import annotations

import pytest

from shardex.testing import BackendTests

pytest.importorskip("torch")


class TestTorchBackend(BackendTests):
    backend_name = "torch"
