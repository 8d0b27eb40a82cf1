"""One writer per output (a lock: flock locally, a lease on object storage), and no
process left running by a killed export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardex
from helpers import listed_now
from shardex.errors import OutputLockedError, ShardexError, StorageError
from shardex.exporter import export_files
from shardex.storage import LocalStorage, ObjectStorage
from shardex.storage.lock import LOCK_FILE, LeaseLock
from tests.support.s3data import S3Location

CLI = [sys.executable, "-c", "from shardex.cli import main; main()"]

# An export slow enough (5 ms per write) that a second one starts while it runs.
SLOW_EXPORT = """
import sys, time, shardex
from shardex.storage.local import LocalStorage, LocalObjectWriter
class SlowWriter(LocalObjectWriter):
    def write(self, data):
        time.sleep(0.005)
        super().write(data)
class Slow(LocalStorage):
    def open_writer(self, path):
        return SlowWriter(self.root, path)
shardex.export(sys.argv[1], Slow(sys.argv[2]), mode="overwrite", samples_per_shard=10, workers=1)
"""


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_second_export_into_the_same_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, "demo:80", str(out)])
    deadline = time.monotonic() + 60
    while not listed_now(out, "*/*.tar"):
        assert first.poll() is None, "the first export ended before the second started"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = subprocess.run(
        [*CLI, "export-dataset", "demo:40", "-o", str(out), "--overwrite", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.poll() is None, "the first export ended before the second was refused"
    assert second.returncode == 1
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(f"error: output {out} is being written by another export ")
    assert f"export --mode overwrite by pid {first.pid} on " in lines[0]
    assert first.wait(timeout=120) == 0
    config = shardex.read_config(out)
    assert config.num_samples == 80  # the first export, whole; nothing of the second
    assert _files(out) == {"config.yaml", *export_files(config)}  # no lock file left
    assert shardex.verify(out).ok


def test_a_held_lock_refuses_every_mode_and_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shardex.export("demo:20", out, workers=1)
    before = {p: (out / p).read_bytes() for p in _files(out)}
    with LocalStorage(out).lock("a test holding the lock"):
        for mode in ("error", "overwrite", "resume", "append"):
            with pytest.raises(OutputLockedError, match="a test holding the lock"):
                shardex.export("demo:30", out, workers=1, mode=mode)
    assert {p: (out / p).read_bytes() for p in _files(out)} == before
    shardex.export("demo:30", out, workers=1, mode="overwrite")  # released: it writes
    assert shardex.read_config(out).num_samples == 30
    assert not (out / LOCK_FILE).exists()


def test_a_failed_export_leaves_no_folder_behind(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ShardexError):  # fails after taking the lock
        shardex.export(tmp_path / "empty", tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


def test_s3_lease_refuses_a_second_writer_and_expires_after_a_kill(
    s3: S3Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDEX_LOCK_LEASE", "2")
    storage = ObjectStorage(s3.url, s3.direct)
    options = {"storage_options": s3.direct, "workers": 1}
    with storage.lock("a test holding the lease"):
        time.sleep(3)  # longer than the lease: it is renewed while held
        with pytest.raises(OutputLockedError, match="a test holding the lease"):
            shardex.export("demo:20", s3.url, **options)
    assert list(storage.list()) == []  # released and removed; the refused export wrote nothing
    # a lease left by a killed writer: refused until it expires, then taken over
    stale = {"holder": "export --mode error by pid 1 on gone", "expires": time.time() + 1.5}
    storage.put(LOCK_FILE, json.dumps(stale).encode())
    with pytest.raises(OutputLockedError, match="pid 1 on gone"):
        shardex.export("demo:20", s3.url, **options)
    time.sleep(2)
    shardex.export("demo:20", s3.url, **options)
    assert LOCK_FILE not in set(storage.list())
    assert shardex.verify(s3.url, storage_options=s3.direct).ok


@pytest.mark.parametrize("expires", ["1e308", "Infinity", "-Infinity", "NaN", '"soon"'])
def test_s3_a_lease_with_an_absurd_expiry_is_unreadable_and_taken_over(
    s3: S3Location, expires: str
) -> None:
    """Anyone can write the lease object: an expiry past any real lease (or none at all)
    is an unreadable lease, taken over as documented, never a traceback."""
    storage = ObjectStorage(s3.url, s3.direct)
    storage.put(LOCK_FILE, f'{{"holder": "someone", "expires": {expires}}}'.encode())
    config = shardex.export("demo:20", s3.url, storage_options=s3.direct, workers=1)
    assert config.num_samples == 20
    assert LOCK_FILE not in set(storage.list())


def test_s3_a_huge_lease_holder_is_cut_in_the_message(s3: S3Location) -> None:
    storage = ObjectStorage(s3.url, s3.direct)
    holder = "x\x1b[31m" + "h" * 1_000_000
    lease = {"holder": holder, "expires": time.time() + 600}
    storage.put(LOCK_FILE, json.dumps(lease).encode())
    with pytest.raises(OutputLockedError) as refused:
        shardex.export("demo:20", s3.url, storage_options=s3.direct, workers=1)
    message = str(refused.value)
    assert len(message) < 600 and "\n" not in message, message[:1000]
    assert "1,000,006 characters" in message
    storage.delete(LOCK_FILE)


def test_s3_a_writer_that_lost_its_lease_does_not_commit(
    s3: S3Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDEX_LOCK_LEASE", "1")
    storage = ObjectStorage(s3.url, s3.direct)
    lock = storage.lock("the first writer")
    storage.put(LOCK_FILE, b'{"holder": "another writer", "expires": 0}')  # taken over
    deadline = time.monotonic() + 10
    while True:  # the next renewal (every 0.25 s, each a request) finds the lock changed
        try:
            lock.check()
        except OutputLockedError as lost:
            assert "no longer holds the lock" in str(lost)
            break
        assert time.monotonic() < deadline, "no renewal found the lock taken over"
        time.sleep(0.05)
    lock.release()
    assert storage.get(LOCK_FILE) == b'{"holder": "another writer", "expires": 0}'


def test_a_writer_whose_renewals_fail_past_its_lease_does_not_commit(tmp_path: Path) -> None:
    class Unreachable(LocalStorage):  # the store stops answering after the lock is taken
        down = False

        def put_if(self, path: str, data: bytes, tag: str | None) -> str | None:
            if self.down:
                raise StorageError("connection refused")
            return super().put_if(path, data, tag)

    storage = Unreachable(tmp_path)
    lock = LeaseLock(storage, "a writer", lease=1.0)
    lock.check()
    storage.down = True
    time.sleep(1.3)
    with pytest.raises(OutputLockedError, match="lease expired"):
        lock.check()
    lock.release()


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, changed = {pid}, True
    while changed:
        changed = False
        for child, parent in parents.items():
            if parent in found and child not in found:
                found.add(child)
                changed = True
    return found - {pid}


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_export_leaves_no_process_running(tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = (
        "import sys, shardex; "
        "shardex.export('demo:400', sys.argv[1], samples_per_shard=10, workers=2)"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(out)])
    deadline = time.monotonic() + 60
    while len(listed_now(out, "*/*.tar")) < 2:
        assert child.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.01)
    helpers = _descendants(child.pid)
    assert len(helpers) >= 3  # two workers, the forkserver (and the resource tracker)
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 5
    while any(_running(p) for p in helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in helpers if _running(p)]
    for pid in left:  # do not leave them to the next tests
        os.kill(pid, signal.SIGKILL)
    assert left == []
    shardex.export("demo:400", out, samples_per_shard=10, workers=2, mode="resume")
    assert shardex.verify(out).ok
