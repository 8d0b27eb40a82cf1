"""Progress of a long export, as a person sees it: the CLI on a (pseudo-)terminal, the CLI
in a log, the API with ``progress=True``; with the local executor and with Ray."""

from __future__ import annotations

import io
import os
import pty
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

import shardex
from shardex.progress import Progress
from tests.support.raycluster import local_ray_cluster

CLI = [sys.executable, "-c", "import sys; from shardex.cli import main; sys.exit(main())"]
SOURCE = "demo:200"
PER_SHARD = 10

#: The export bar's figures: done/total, then samples/s, bytes/s with a unit, shards/s.
BAR = re.compile(
    r"writing shards.*?(\d+)/(\d+)\s+([\d.,]+) samples/s, ([\d.]+) (k?M?G?B)/s, "
    r"([\d.,]+) shards/s.*?eta\s+(\d+:\d\d:\d\d)"
)
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _on_terminal(args: list[str], limit: float = 300) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal (200 columns) as its stdout and stderr; its exit
    status and everything it wrote, ANSI codes removed."""
    import fcntl
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERM")}
    child = subprocess.Popen(
        [*CLI, *args], stdin=follower, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    out = bytearray()
    deadline = time.monotonic() + limit
    waiting = selectors.DefaultSelector()  # not select(): descriptors past 1024 are fine
    waiting.register(leader, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not waiting.select(1.0):
                continue
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        waiting.close()
        os.close(leader)
        if child.poll() is None and (time.monotonic() >= deadline or sys.exc_info()[0]):
            child.kill()
    return child.wait(), ANSI.sub("", out.decode(errors="replace"))


def _check_bar(text: str, out: Path) -> None:
    """The last drawn export bar: every sample done, and rates whose ratios are the export's
    true samples per shard and bytes per sample (the same elapsed time divides all three)."""
    frames = BAR.findall(text)
    assert frames, f"no export bar with samples/s, B/s, shards/s in:\n{text[-2000:]}"
    done, total, samples_s, num, unit, shards_s, eta = frames[-1]
    config = shardex.read_config(out)
    shards = sum(len(s.shards) for s in config.splits.values())
    size = sum(s.num_bytes for s in config.splits.values())
    assert int(done) == int(total) == config.num_samples
    samples_rate = float(samples_s.replace(",", ""))
    shards_rate = float(shards_s.replace(",", ""))
    bytes_rate = float(num) * UNITS[unit]
    assert min(samples_rate, shards_rate, bytes_rate) > 0
    assert samples_rate / shards_rate == pytest.approx(config.num_samples / shards, rel=0.03)
    assert bytes_rate / samples_rate == pytest.approx(size / config.num_samples, rel=0.03)
    assert eta == "0:00:00"  # finished: nothing left


def test_cli_on_a_terminal_shows_samples_bytes_shards_per_second_and_eta(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, text = _on_terminal(
        ["export-dataset", SOURCE, "-o", str(out), "--samples-per-shard", str(PER_SHARD)]
    )
    assert code == 0, text[-2000:]
    _check_bar(text, out)
    assert f"exported {shardex.read_config(out).num_samples} samples" in text


def test_cli_in_a_log_prints_the_bars_once_without_terminal_codes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    start = time.monotonic()
    done = subprocess.run(
        [*CLI, "export-dataset", SOURCE, "-o", str(out), "--samples-per-shard", str(PER_SHARD)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    assert "\r" not in done.stdout
    bar_lines = [line for line in done.stdout.splitlines() if "writing shards" in line]
    # the final frame, plus at most one plain line a minute (none for a short export)
    assert 1 <= len(bar_lines) <= 1 + took / 60
    _check_bar(done.stdout, out)
    assert max(len(line) for line in done.stdout.splitlines()) <= 150  # no wrapped columns


def test_api_progress_true_shows_the_rates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    shardex.export(SOURCE, out, samples_per_shard=PER_SHARD, progress=True)
    _check_bar(capsys.readouterr().out, out)
    shardex.export(SOURCE, tmp_path / "quiet", samples_per_shard=PER_SHARD)
    assert "samples/s" not in capsys.readouterr().out  # a library call that did not ask


def test_a_log_gets_plain_lines_with_rates_and_eta_as_shards_complete() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=100)
    with Progress(True, console=console, plain_every=0) as bars:
        bar = bars.export_task("writing shards", 40)
        for _ in range(4):
            bar.shard(10, 5_000)
        bar.done()
    lines = buf.getvalue().splitlines()
    plain = [line for line in lines if line.startswith("writing shards:")]
    assert [re.match(r"writing shards: (\d+)/40 samples", p)[1] for p in plain] == [  # type: ignore[index]
        "10",
        "20",
        "30",
        "40",
    ]
    assert all(re.search(r"samples/s, [\d.]+ k?M?B/s, [\d.,]+ shards/s", p) for p in plain)
    assert plain[-1].endswith("eta 0:00:00")  # the time left, once a rate is known


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray = pytest.importorskip("ray")
    with local_ray_cluster(num_cpus=2):
        yield ray.get_runtime_context().gcs_address


def test_cli_on_ray_shows_the_same_bar(tmp_path: Path, ray_address: str) -> None:
    out = tmp_path / "out"
    code, text = _on_terminal(
        [
            "export-dataset",
            SOURCE,
            "-o",
            str(out),
            "--samples-per-shard",
            str(PER_SHARD),
            "--executor",
            "ray",
            "--ray-address",
            ray_address,
        ]
    )
    assert code == 0, text[-2000:]
    _check_bar(text, out)
