"""A process's object-storage helper ends with that process, even when it forked a child
that lives on (a DataLoader worker forking, a pool started from it): the child must not
keep the pipe the helper watches. Real processes: a SeaweedFS server, the helper, fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.s3data import S3Location

#: Starts its helper, forks a child that sleeps, prints both pids and ends as a
#: multiprocessing worker does (os._exit: no atexit handler closes the helper) or killed.
_OWNER = """
import json, os, sys, time
from shardex.storage import helper
store = helper.HelperObjectStorage(sys.argv[1], json.loads(sys.argv[2]))
store.exists("nothing")  # starts this process's helper
print(helper._client._proc.pid, flush=True)
child = os.fork()
if child == 0:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the test reads this output to its end
        os.dup2(null, fd)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
if sys.argv[3] == "kill":
    os.kill(os.getpid(), 9)
os._exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone, and so does one reaped now
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_the_helper_ends_with_its_owner_while_a_forked_child_lives(
    end: str, s3: S3Location, tmp_path: Path
) -> None:
    # files, not pipes: the helper writes to the owner's stderr, and a pipe would be read
    # until the helper ends
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        owner = subprocess.Popen(
            [sys.executable, "-c", _OWNER, s3.url, json.dumps(s3.direct), end],
            stdout=stdout,
            stderr=stderr,
        )
        status = owner.wait(timeout=60)
    assert status == (0 if end == "exit" else -signal.SIGKILL), err.read_text()
    helper_pid, child_pid = (int(line) for line in out.read_text().split())
    try:
        assert _alive(child_pid), "the forked child should still be sleeping"
        deadline = time.monotonic() + 10
        while _alive(helper_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(helper_pid), "the helper outlives its owner while the child lives"
        assert _alive(child_pid)
    finally:
        for pid in (child_pid, helper_pid):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
