"""The object-storage client of a process (``shardex.storage.direct``): the stores it
keeps for reuse are bounded, so a process that reads many exports in turn holds the
connections of a few of them, not one per export it ever read."""

from __future__ import annotations

import gc
import os

from shardex.storage import open_storage
from tests.support.s3data import S3Location


def test_reading_many_roots_in_turn_keeps_no_socket_per_root(s3: S3Location) -> None:
    """A process that reads many exports one after another (a service, a notebook) holds
    the connections of a bounded number of stores, not one socket per root it ever read:
    the per-process store reuse kept every store (and its socket, ~130 KB) for ever."""

    def read(root: int) -> None:
        assert not open_storage(f"{s3.url}/root-{root}", s3.direct).exists("x")

    for root in range(10):
        read(root)
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for root in range(10, 70):
        read(root)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) - before < 20
