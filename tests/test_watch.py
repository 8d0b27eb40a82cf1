"""The suite's end-of-run list of processes it left running (tests/support/watch.py):
its own, never the machine's other work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.watch import RUN_VARIABLE, Watch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _orphan(env: dict[str, str]) -> int:
    """A ``sleep`` whose parent shell has ended: re-parented, no descendant of this one."""
    done = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_left_running_lists_the_runs_processes_and_no_other() -> None:
    watch = Watch(None)
    time.sleep(0.05)  # (start times count in 1/100 s)
    plain = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    child = subprocess.Popen(["sleep", "60"])
    ours = _orphan({**plain, RUN_VARIABLE: watch.run})
    other = _orphan(plain)  # started during the run, by something else
    stale = _orphan({**plain, RUN_VARIABLE: "another run"})
    try:
        pids = {int(line.split(" ", 1)[0]) for line in watch.left_running()}
        assert child.pid in pids
        assert ours in pids
        assert other not in pids
        assert stale not in pids
    finally:
        child.kill()
        child.wait()
        for pid in (ours, other, stale):
            os.kill(pid, signal.SIGKILL)
