"""Review r1 of session 11: defects found in what landed on main (84295d6..), each
shown by a test that failed before its fix."""

from __future__ import annotations

import gc
import os

from conftest import S3Location
from shardex.storage import open_storage


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_reading_many_roots_in_turn_keeps_no_socket_per_root(s3: S3Location) -> None:
    """A process that reads many exports one after another (a service, a notebook) holds
    the connections of a bounded number of stores, not one socket per root it ever read:
    the per-process store reuse kept every store (and its socket, ~130 KB) for ever."""

    def read(root: int) -> None:
        assert not open_storage(f"{s3.url}/root-{root}", s3.direct).exists("x")

    for root in range(10):
        read(root)
    gc.collect()
    before = _open_fds()
    for root in range(10, 70):
        read(root)
    gc.collect()
    assert _open_fds() - before < 20
