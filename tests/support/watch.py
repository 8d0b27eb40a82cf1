"""What the suite prints about the machine when something goes wrong, and its time budget.

A CI log may show only its last lines, and a run stopped from outside prints no summary.
So a failure is reported the moment it happens, on one line with the machine's state
(load, free memory, free disk), the first few also with the busiest processes; processes
the suite started and left running are listed at its end (its own descendants, and those
re-parented since that carry its :data:`RUN_VARIABLE`: never the machine's other work);
and with
``SHARDEX_TEST_BUDGET_S`` set, tests that would start after that many seconds are skipped,
so that a run slowed down by something else still ends with its summary.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Final

#: The suite's run, in its environment (conftest sets it): a process the run started that
#: outlived its parent, and so is no longer its descendant, still carries it.
RUN_VARIABLE: Final = "SHARDEX_TEST_RUN"

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_state() -> str:
    """Load, free memory and free disk, on one line (Linux; elsewhere what is known)."""
    parts = []
    try:
        parts.append("load " + " ".join(Path("/proc/loadavg").read_text().split()[:3]))
        memory = Path("/proc/meminfo").read_text()
        line = next(line for line in memory.splitlines() if line.startswith("MemAvailable:"))
        parts.append(f"memory free {int(line.split()[1]) // 1024} MiB")
    except (OSError, StopIteration):
        pass
    free = shutil.disk_usage(tempfile.gettempdir()).free
    parts.append(f"disk free {free // 2**20} MiB")
    parts.append(f"{len(_pids())} processes")
    return ", ".join(parts)


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, CPU ticks used, start time in ticks since boot) of ``pid``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160] or "?"


def busiest(count: int = 5, over: float = 1.0) -> list[str]:
    """The ``count`` processes that used the most CPU during the next ``over`` seconds."""
    before = {pid: stat for pid in _pids() if (stat := _stat(pid))}
    time.sleep(over)
    used = []
    for pid, (_, ticks, started) in before.items():
        now = _stat(pid)
        if now is not None and now[2] == started:
            used.append((now[1] - ticks, pid))
    used.sort(reverse=True)
    return [
        f"{pid} {100 * ticks / _TICKS / over:.0f}% CPU: {_command(pid)}"
        for ticks, pid in used[:count]
        if ticks > 0
    ]


def _environment_has(pid: int, entry: bytes) -> bool:
    """Whether ``NAME=value`` (``entry``) is in the environment ``pid`` started with."""
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # another user's, or gone
        return False


def _boot_ticks_now() -> float:
    return float(Path("/proc/uptime").read_text().split()[0]) * _TICKS


class Watch:
    """The suite's failure lines, its end-of-run list of left-over processes, its budget."""

    def __init__(self, budget_s: float | None) -> None:
        self.budget_s = budget_s
        self.started = time.monotonic()
        self._started_ticks: float | None
        try:
            self._started_ticks = _boot_ticks_now()
        except OSError:
            self._started_ticks = None
        self.failures = 0
        self.over_budget = False
        #: This run's value of :data:`RUN_VARIABLE`.
        self.run = f"{os.getpid()}-{time.time_ns()}"

    def spent(self) -> bool:
        if self.budget_s is None or time.monotonic() - self.started < self.budget_s:
            return False
        self.over_budget = True
        return True

    def failure_lines(self, nodeid: str, when: str, duration: float, message: str) -> list[str]:
        self.failures += 1
        lines = [
            f"!! FAILED {nodeid} ({when}, {duration:.1f} s, at {self.elapsed()}): {message}",
            f"   machine: {machine_state()}",
        ]
        if self.failures <= 3:  # the first ones say what else was running
            lines += [f"   busiest: {line}" for line in busiest()]
        return lines

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.0f} s into the run"

    def left_running(self) -> list[str]:
        """Processes the suite started that still run (but this one): its descendants, and
        those carrying this run's :data:`RUN_VARIABLE` (re-parented when theirs ended)."""
        if self._started_ticks is None:
            return []
        me = os.getpid()
        stats = {pid: stat for pid in _pids() if (stat := _stat(pid))}
        entry = f"{RUN_VARIABLE}={self.run}".encode()

        def descends(pid: int) -> bool:
            seen: set[int] = set()
            while pid in stats and pid not in seen:
                seen.add(pid)
                pid = stats[pid][0]
                if pid == me:
                    return True
            return False

        found = []
        for pid, stat in stats.items():
            if pid == me or stat[2] < self._started_ticks:
                continue
            if not descends(pid) and not _environment_has(pid, entry):
                continue  # the machine's other work
            command = _command(pid)
            if command == "?":  # a kernel thread, or gone already
                continue
            if stat[0] == me and "multiprocessing." in command:  # this process's forkserver
                continue  # and resource tracker: they end with it
            found.append(f"{pid} (parent {stat[0]}, {stat[1] / _TICKS:.0f} s CPU): {command}")
        return found
