"""Faults: a killed export, a full disk, a flaky or restarting object store. Whatever
happens, nothing exported is lost or silently wrong, and resume gives the same bytes."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import shardex
from conftest import S3Location
from shardex.errors import NotAnExportError, StorageError
from shardex.sources import DemoSource
from shardex.storage import LocalStorage, ObjectStorage
from shardex.storage.local import LocalObjectWriter, is_temporary

OPTIONS: dict[str, Any] = {
    "samples_per_shard": 10,
    "workers": 1,
    "split_fractions": {"train": 0.8, "val": 0.2},
}
SOURCE = "demo:120"

# An export that writes slowly (5 ms per write), so that it can be killed mid-way.
SLOW_EXPORT = """
import sys, time, shardex
from shardex.storage.local import LocalStorage, LocalObjectWriter
class SlowWriter(LocalObjectWriter):
    def write(self, data):
        time.sleep(0.005)
        super().write(data)
class Slow(LocalStorage):
    def open_writer(self, path):
        return SlowWriter(self._path(path))
    def sync(self, paths):  # leaves time to be killed after metadata.parquet, before commit
        time.sleep(0.5)
        super().sync(paths)
shardex.export(sys.argv[1], Slow(sys.argv[2]), mode=sys.argv[3], samples_per_shard=10,
               workers=1, split_fractions={"train": 0.8, "val": 0.2})
"""


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    DemoSource(120).scan()
    out = tmp_path_factory.mktemp("clean") / "out"
    shardex.export(SOURCE, out, **OPTIONS)
    return _files(out)


def _kill_when(out: Path, ready: Any) -> None:
    child = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, SOURCE, str(out), "error"])
    deadline = time.monotonic() + 60
    while not ready(out):
        assert child.poll() is None, "the export ended before the kill point"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    child.send_signal(signal.SIGKILL)
    child.wait()


KILL_POINTS = {
    "first shard": lambda out: len(list(out.glob("*/*.tar"))) >= 1,
    "third shard": lambda out: len(list(out.glob("*/*.tar"))) >= 3,
    "sixth shard": lambda out: len(list(out.glob("*/*.tar"))) >= 6,
    "val split": lambda out: len(list(out.glob("val/*.tar"))) >= 1,
    "before commit": lambda out: (out / "metadata.parquet").exists(),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_export_resumes_to_identical_bytes(
    clean: dict[str, bytes], tmp_path: Path, point: str
) -> None:
    out = tmp_path / "out"
    _kill_when(out, KILL_POINTS[point])
    assert not (out / "config.yaml").exists()
    with pytest.raises(NotAnExportError):
        shardex.open_dataset(out, split="train")
    kept = {p.name: p.stat().st_ino for p in out.glob("*/*.tar")}
    shardex.export(SOURCE, out, mode="resume", **OPTIONS)
    assert _files(out) == clean
    same = [
        name for name, ino in kept.items() if (next(out.glob(f"*/{name}"))).stat().st_ino == ino
    ]
    assert len(same) >= len(kept) - 1  # complete shards were kept, not rewritten
    assert shardex.verify(out).ok


class FullDisk(LocalStorage):
    """A disk that fills up after ``budget`` bytes of writes."""

    def __init__(self, root: Path, budget: int) -> None:
        super().__init__(root)
        self.budget = budget

    def open_writer(self, path: str) -> LocalObjectWriter:
        disk = self

        class Writer(LocalObjectWriter):
            def write(self, data: Any) -> None:
                disk.budget -= len(data)
                if disk.budget < 0:
                    self.abort()
                    raise StorageError(
                        f"cannot write {path}: {OSError(errno.ENOSPC, 'No space left on device').strerror}"
                    )
                super().write(data)

        return Writer(self._path(path))


def test_real_enospc_from_a_write_is_a_clear_error(tmp_path: Path) -> None:
    writer = LocalObjectWriter(tmp_path / "x.bin")

    class Broken:
        def write(self, data: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            pass

    writer._file.close()
    writer._file = Broken()  # type: ignore[assignment]
    with pytest.raises(StorageError, match="No space left on device"):
        writer.write(b"abc")
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


def test_disk_full_keeps_shards_and_resumes(clean: dict[str, bytes], tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(StorageError, match="No space left on device"):
        shardex.export(SOURCE, FullDisk(out, budget=600_000), **OPTIONS)
    written = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert written
    assert not any(is_temporary(n) for n in written)
    # what remains besides the shards: the record of the unfinished export (see resume)
    assert [n for n in written if n.startswith(".")] == [".shardex-intent.json"]
    assert not (out / "config.yaml").exists()
    shardex.export(SOURCE, out, mode="resume", **OPTIONS)
    assert _files(out) == clean


def test_s3_requests_that_time_out_are_retried(s3: S3Location) -> None:
    shardex.export("demo:30", s3.url, storage_options=s3.direct, workers=1)
    quick = {**s3.counted, "timeout": "500ms"}
    ds = shardex.open_dataset(s3.url, storage_options=quick)
    expected = shardex.open_dataset(s3.url, storage_options=s3.direct)[4]
    s3.proxy.reset()
    s3.proxy.delay_next(2, 1.5, when=lambda head: head.range is not None)
    assert ds[4] == expected  # two attempts time out, the third answers
    s3.proxy.wait_idle()
    delayed = [r for r in s3.proxy.requests if r.fault == "delay"]
    assert len(delayed) == 2


def test_s3_export_survives_errors_and_a_server_restart(s3: S3Location, tmp_path: Path) -> None:
    DemoSource(120).scan()
    shardex.export(SOURCE, tmp_path / "local", **OPTIONS)
    script = (
        "import json, sys, shardex; shardex.export(sys.argv[1], sys.argv[2], "
        "storage_options=json.loads(sys.argv[3]), samples_per_shard=10, workers=1, "
        "split_fractions={'train': 0.8, 'val': 0.2})"
    )
    s3.proxy.fail_next(3, status=503, when=lambda head: head.method == "PUT")
    s3.proxy.fail_next(2, status=500, when=lambda head: head.method == "GET")  # the LIST
    s3.proxy.delay_next(5, 0.3, when=lambda head: head.method == "PUT")
    child = subprocess.Popen([sys.executable, "-c", script, SOURCE, s3.url, json.dumps(s3.counted)])
    storage = ObjectStorage(s3.url, s3.direct)
    deadline = time.monotonic() + 60
    while sum(n.endswith(".tar") for n in storage.list()) < 4:
        assert child.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s3.server.restart(kill=True)  # mid-export; the client retries until it is back
    assert child.wait(timeout=120) == 0
    failed = sorted(r.status for r in s3.proxy.requests if r.fault == "fail")
    assert failed == [500] * 2 + [503] * 3
    assert {name: storage.get(name) for name in storage.list()} == _files(tmp_path / "local")
