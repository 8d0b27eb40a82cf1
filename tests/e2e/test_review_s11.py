"""Review r1 of session 11: defects found in what landed on main (84295d6..), each
shown by a test that failed before its fix."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np

import shardex
from tests.support.s3data import S3Location
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


def _deleted_files_held_open(under: Path) -> list[str]:
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)) and target.endswith(" (deleted)"):
            held.append(target)
    return held


def test_array_exports_leave_no_descriptor_open_and_no_deleted_part_held(tmp_path: Path) -> None:
    """A per-split array export reads its workers' run parts and deletes them: the
    descriptors it read them through were dropped from the cache without being closed,
    so every export leaked ~125 of them (a test run reached select()'s limit of 1,024),
    each keeping a deleted part's disk space until the process ended."""
    data = {"key": [f"k{i}" for i in range(40)], "x": [np.full(3, i) for i in range(40)]}
    shardex.export(data, tmp_path / "warm", backend="numpy_mmap", samples_per_shard=4)
    gc.collect()
    before = _open_fds()
    for k in range(3):
        shardex.export(data, tmp_path / f"out{k}", backend="numpy_mmap", samples_per_shard=4)
    gc.collect()
    assert _open_fds() - before < 5
    assert _deleted_files_held_open(tmp_path) == []
