"""The object-storage client of a process (``shardex.storage.direct``): the stores it
keeps for reuse are bounded, so a process that reads many exports in turn holds the
connections of a few of them, not one per export it ever read; and a process that
exits while its requests are in flight exits well."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Final

from shardex.storage import open_storage
from tests.support.s3data import S3Location

_EXIT_MID_REQUEST: Final = """
import json, sys, time
from shardex.storage import open_storage

class SlowTeardown:  # the interpreter's teardown lasts: an answer can come during it
    def __del__(self):
        time.sleep(1.5)

slow = SlowTeardown()
storage = open_storage(sys.argv[1], json.loads(sys.argv[2]))
storage.submit_range_batch([("x", 0, 4), ("x", 4, 4)])  # sent, and never waited for
time.sleep(0.3)  # at the server, which answers in a second
print("exiting")
"""


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


def test_a_process_exiting_while_its_reads_are_in_flight_exits_well(s3: S3Location) -> None:
    """Reads still in flight at exit end before the interpreter is torn down: the native
    threads that finish them call into Python, which during the teardown printed a panic
    of theirs, or (when one was already handing its answer over) aborted the process:
    SIGABRT after it had printed all it had to."""
    open_storage(s3.url, s3.direct).put("x", b"12345678")
    s3.proxy.delay_next(2, 1.0, when=lambda head: head.method == "GET")
    try:
        reader = subprocess.run(
            [sys.executable, "-c", _EXIT_MID_REQUEST, s3.url, json.dumps(s3.counted)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        s3.proxy.clear_faults()
    assert (reader.returncode, reader.stdout) == (0, "exiting\n"), reader.stderr[-2000:]
    assert "panicked" not in reader.stderr, reader.stderr[-2000:]
