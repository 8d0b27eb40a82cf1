"""Faults: a killed export, a full disk, a flaky or restarting object store. Whatever
happens, nothing exported is lost or silently wrong, and resume gives the same bytes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import shardex
from helpers import files_of, listed_now
from shardex.backends.webdataset import writer as shard_writer
from shardex.errors import NotAnExportError, OutputExistsError, OutputLockedError, StorageError
from shardex.exporter import export_files
from shardex.sources import DemoSource
from shardex.storage import LocalStorage, ObjectStorage
from shardex.storage.local import LocalObjectWriter, is_temporary
from tests.support.s3data import S3Location

OPTIONS: dict[str, Any] = {
    "samples_per_shard": 10,
    "workers": 1,
    "split_fractions": {"train": 0.8, "val": 0.2},
}
SOURCE = "demo:120"

# An export that writes slowly (1 ms per write: ~0.2 s a shard), so that it can be killed mid-way.
SLOW_EXPORT = """
import sys, time, shardex
from shardex.storage.local import LocalStorage, LocalObjectWriter
class SlowWriter(LocalObjectWriter):
    def write(self, data):
        time.sleep(0.001)
        super().write(data)
class Slow(LocalStorage):
    def open_writer(self, path):
        return SlowWriter(self.root, path)
    def sync(self, paths):  # leaves time to be killed after metadata.parquet, before commit
        time.sleep(0.5)
        super().sync(paths)
shardex.export(sys.argv[1], Slow(sys.argv[2]), mode=sys.argv[3], samples_per_shard=10,
               workers=1, split_fractions={"train": 0.8, "val": 0.2})
"""


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    DemoSource(120).scan()
    out = tmp_path_factory.mktemp("clean") / "out"
    shardex.export(SOURCE, out, **OPTIONS)
    return files_of(out)


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
    "first shard": lambda out: len(listed_now(out, "*/*.tar")) >= 1,
    "third shard": lambda out: len(listed_now(out, "*/*.tar")) >= 3,
    "sixth shard": lambda out: len(listed_now(out, "*/*.tar")) >= 6,
    "val split": lambda out: len(listed_now(out, "val/*.tar")) >= 1,
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
    assert files_of(out) == clean
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

            def write_parts(self, parts: Any) -> None:  # the shard writer's writev
                disk.budget -= sum(map(len, parts))
                if disk.budget < 0:
                    self.abort()
                    raise StorageError(
                        f"cannot write {path}: {OSError(errno.ENOSPC, 'No space left on device').strerror}"
                    )
                super().write_parts(parts)

        return Writer(self.root, path)


def test_real_enospc_from_a_write_is_a_clear_error(tmp_path: Path) -> None:
    writer = LocalObjectWriter(tmp_path, "x.bin")

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
    assert files_of(out) == clean


class FailingWrite(LocalStorage):
    """A disk whose ``fail_at``-th shard write fails, aborting its file as a real write
    does, while the writes after it are queued (each slow, so several wait behind it)."""

    def __init__(self, root: Path, fail_at: int) -> None:
        super().__init__(root)
        self.calls = 0
        self.fail_at = fail_at

    def open_writer(self, path: str) -> LocalObjectWriter:
        disk = self

        class Writer(LocalObjectWriter):
            def write_parts(self, parts: Any) -> None:
                disk.calls += 1
                time.sleep(0.01)
                if disk.calls == disk.fail_at:
                    self.abort()
                    raise StorageError(f"cannot write {path}: Input/output error")
                super().write_parts(parts)

        return Writer(self.root, path)


def test_a_failed_write_with_others_queued_behind_it_loses_nothing(
    clean: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a write per sample, so that each shard queues many: the third fails while the
    # writes after it wait; the export stops with it, leaves no half shard, and resumes
    monkeypatch.setattr(shard_writer, "_FLUSH", 1)
    disk = FailingWrite(tmp_path / "out", fail_at=3)
    with pytest.raises(StorageError, match="Input/output error"):
        shardex.export(SOURCE, disk, **OPTIONS)
    assert disk.calls == 3  # the writes queued behind the failed one were dropped
    left = [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert not any(is_temporary(n) or n.endswith(".tar") for n in left)
    shardex.export(SOURCE, tmp_path / "out", mode="resume", **OPTIONS)
    assert files_of(tmp_path / "out") == clean
    # many writes in flight at once write the same bytes as one at a time
    monkeypatch.setattr(shard_writer, "_IN_FLIGHT", 1)
    shardex.export(SOURCE, tmp_path / "one", **OPTIONS)
    assert files_of(tmp_path / "one") == clean


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
    assert {name: storage.get(name) for name in storage.list()} == files_of(tmp_path / "local")


# ------------------------------------------------- a SIGKILL at every step of every mode

# An export that SIGKILLs itself at a named step of its work: the step (after/before a
# put, a delete, or a write that completes) and the how-manieth match of a path pattern.
KILL_AT_STEP = """
import fnmatch, json, os, signal, sys
import shardex
from shardex.storage import LocalStorage, ObjectStorage
from shardex.storage.base import ObjectWriter

source, out, mode, point, options, s3 = sys.argv[1:7]
step_name, pattern, nth = json.loads(point)
seen = [0]

def step(name, path):
    if name == step_name and fnmatch.fnmatch(path, pattern):
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)

class Hooked(ObjectWriter):
    def __init__(self, inner, path):
        self.inner, self.path = inner, path
    def write(self, data):
        self.inner.write(data)
    def commit(self):
        self.inner.commit()
        step("wrote", self.path)
    def abort(self):
        self.inner.abort()
    @property
    def tell(self):
        return self.inner.tell

def hooks(base):
    class Killing(base):
        def open_writer(self, path):
            return Hooked(super().open_writer(path), path)
        def put(self, path, data):
            step("before-put", path)
            super().put(path, data)
            step("after-put", path)
        def delete(self, path):
            step("before-delete", path)
            super().delete(path)
            step("after-delete", path)
    return Killing

storage = (
    hooks(ObjectStorage)(out, json.loads(s3)) if s3 != "-" else hooks(LocalStorage)(out)
)
shardex.export(source, storage, mode=mode, **json.loads(options))
"""

STEP_OPTIONS: dict[str, Any] = {
    "workers": 1,
    "samples_per_shard": 4,
    "split_fractions": {"train": 0.7, "val": 0.3},
    "seed": 4,
}
#: Each step of an export's work, in order (fresh exports have no stale files to delete).
STEPS: dict[str, tuple[str, str, int]] = {
    "record written": ("after-put", ".shardex-intent.json", 1),
    "first shard": ("wrote", "*.tar", 1),
    "third shard": ("wrote", "*.tar", 3),
    "first index": ("wrote", "*/index-keys*.npy", 1),  # streamed out: a writer
    "metadata written": ("wrote", "metadata*.parquet", 1),
    "before commit": ("before-put", "config.yaml", 1),
    "after commit": ("after-put", "config.yaml", 1),
    "first stale file deleted": ("after-delete", "*/*", 1),
    "before the record is removed": ("before-delete", ".shardex-intent.json", 1),
}
#: mode -> (the export it runs over, its source, the mode it runs again with)
MODES: dict[str, tuple[str | None, str, str]] = {
    "fresh": (None, "whole", "resume"),  # mode "error" refuses an unfinished export
    "overwrite": ("relabelled", "whole", "overwrite"),
    "append": ("first", "second", "append"),
}


@pytest.fixture(scope="module")
def step_tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tables over one folder: all 40 samples, the first 25, the last 15, and all 40
    with other labels (the same shard names as 'whole', other bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardex.testing import make_sample_folder

    folder = make_sample_folder(tmp_path_factory.mktemp("step-src"), n=40)
    table = pq.read_table(folder.table)
    rotate = {"class0": "class1", "class1": "class2", "class2": "class0"}
    labels = pa.array([rotate[v] for v in table.column("label").to_pylist()], pa.string())
    tables = {
        "whole": table,
        "first": table.slice(0, 25),
        "second": table.slice(25, 15),
        "relabelled": table.set_column(table.column_names.index("label"), "label", labels),
    }
    paths = {}
    for name, t in tables.items():
        paths[name] = folder.table.with_name(f"{name}.parquet")
        pq.write_table(t, paths[name])
    return paths


def _start_state(out: Path, mode: str, tables: dict[str, Path], s3: S3Location | None) -> None:
    base = MODES[mode][0]
    if base is not None:
        target: Any = s3.url if s3 else out
        extra = {"storage_options": s3.direct} if s3 else {}
        shardex.export(tables[base], target, **STEP_OPTIONS, **extra)


@pytest.fixture(scope="module")
def uninterrupted(
    step_tables: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, bytes]]:
    """Each mode's output when nothing interrupts it."""
    found = {}
    for mode, (_base, source, _again) in MODES.items():
        out = tmp_path_factory.mktemp(f"uninterrupted-{mode}") / "out"
        _start_state(out, mode, step_tables, None)
        export_mode = "error" if mode == "fresh" else mode
        shardex.export(step_tables[source], out, mode=export_mode, **STEP_OPTIONS)
        found[mode] = files_of(out)
    return found


def _kill_at(out: str, mode: str, source: Path, step: str, s3: S3Location | None) -> None:
    export_mode = "error" if mode == "fresh" else mode
    args = [str(source), out, export_mode, json.dumps(STEPS[step]), json.dumps(STEP_OPTIONS)]
    args.append(json.dumps(s3.direct) if s3 else "-")
    env = {**os.environ, "SHARDEX_LOCK_LEASE": "2"}
    child = subprocess.run([sys.executable, "-c", KILL_AT_STEP, *args], env=env, timeout=120)
    assert child.returncode == -signal.SIGKILL, f"{step!r} was not reached"


def _check_committed_or_nothing(location: Any, options: dict[str, Any]) -> None:
    """What a reader finds after the kill: a committed export that verifies, or none."""
    try:
        config = shardex.read_config(location, **options)
    except NotAnExportError:
        return
    report = shardex.verify(location, **options)
    assert report.ok, report.problems
    for split, info in config.splits.items():
        ds = shardex.open_dataset(location, split=split, **options)
        assert len(list(ds)) == info.num_samples


CASES = [
    (mode, step)
    for mode in MODES
    for step in STEPS
    if not (mode == "fresh" and step == "first stale file deleted")
]


@pytest.fixture
def killed(step_tables: dict[str, Path], tmp_path: Path, mode: str, step: str) -> tuple[Path, Path]:
    """An output (``tmp_path / "out"``) in ``mode``'s starting state, then that mode's
    export into it killed at ``step``: the output, and the killed export's source."""
    out = tmp_path / "out"
    _start_state(out, mode, step_tables, None)
    source = step_tables[MODES[mode][1]]
    _kill_at(str(out), mode, source, step, None)
    return out, source


@pytest.mark.parametrize(("mode", "step"), CASES)
def test_killed_at_any_step_then_run_again_gives_the_uninterrupted_output(
    killed: tuple[Path, Path], uninterrupted: dict[str, dict[str, bytes]], mode: str
) -> None:
    out, source = killed
    _check_committed_or_nothing(out, {})
    shardex.export(source, out, mode=MODES[mode][2], **STEP_OPTIONS)
    assert files_of(out) == uninterrupted[mode]
    assert shardex.verify(out).ok


@pytest.mark.parametrize("mode", ["overwrite", "append"])
@pytest.mark.parametrize("step", ["third shard", "before commit", "first stale file deleted"])
def test_resume_finishes_a_killed_overwrite_or_append(
    killed: tuple[Path, Path], uninterrupted: dict[str, dict[str, bytes]], mode: str
) -> None:
    out, source = killed
    shardex.export(source, out, mode="resume", **STEP_OPTIONS)
    assert files_of(out) == uninterrupted[mode]
    with pytest.raises(OutputExistsError, match="nothing to resume"):  # finished now
        shardex.export(source, out, mode="resume", **STEP_OPTIONS)


@pytest.mark.parametrize(
    ("mode", "step"),
    [
        ("overwrite", "before commit"),
        ("overwrite", "first stale file deleted"),
        ("append", "after commit"),
    ],
)
def test_s3_killed_in_the_commit_window_then_run_again(
    s3: S3Location,
    step_tables: dict[str, Path],
    uninterrupted: dict[str, dict[str, bytes]],
    mode: str,
    step: str,
) -> None:
    _start_state(Path(), mode, step_tables, s3)
    source = step_tables[MODES[mode][1]]
    _kill_at(s3.url, mode, source, step, s3)
    options = {"storage_options": s3.direct}
    _check_committed_or_nothing(s3.url, options)
    # the killed writer's lease still holds the output until it expires (2 s here)
    with pytest.raises(OutputLockedError, match="being written by another export"):
        shardex.export(source, s3.url, mode=mode, **STEP_OPTIONS, **options)
    time.sleep(2.5)
    shardex.export(source, s3.url, mode=mode, **STEP_OPTIONS, **options)
    storage = ObjectStorage(s3.url, s3.direct)
    assert {name: storage.get(name) for name in storage.list()} == uninterrupted[mode]
    assert shardex.verify(s3.url, **options).ok


@pytest.mark.parametrize("backend", ["numpy", "zarr"])
@pytest.mark.parametrize(
    "step", ["metadata written", "before commit", "after commit", "first stale file deleted"]
)
def test_array_backends_killed_while_overwriting_then_run_again(
    tmp_path: Path, backend: str, step: str
) -> None:
    """Array runs are rewritten whole: they too go under names the committed export does
    not use, and running again after the kill gives the uninterrupted output."""
    options = {**STEP_OPTIONS, "backend": backend}
    expected_out = tmp_path / "expected"
    shardex.export("demo:30", expected_out, **options)
    shardex.export("demo:40", expected_out, mode="overwrite", **options)
    out = tmp_path / "out"
    shardex.export("demo:30", out, **options)
    args = ["demo:40", str(out), "overwrite", json.dumps(STEPS[step]), json.dumps(options), "-"]
    child = subprocess.run([sys.executable, "-c", KILL_AT_STEP, *args], timeout=120)
    assert child.returncode == -signal.SIGKILL, f"{step!r} was not reached"
    _check_committed_or_nothing(out, {})
    shardex.export("demo:40", out, mode="overwrite", **options)
    assert files_of(out) == files_of(expected_out)
    assert shardex.verify(out).ok


def test_resume_refuses_another_source_and_overwrite_clears_the_leftovers(
    step_tables: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _start_state(out, "overwrite", step_tables, None)
    _kill_at(str(out), "overwrite", step_tables["whole"], "third shard", None)
    with pytest.raises(OutputExistsError, match="interrupted --mode overwrite"):
        shardex.export(step_tables["first"], out, mode="resume", **STEP_OPTIONS)
    config = shardex.export(step_tables["first"], out, mode="overwrite", **STEP_OPTIONS)
    assert config.num_samples == 25
    assert set(files_of(out)) == {"config.yaml", *export_files(config)}  # no leftovers
    assert shardex.verify(out).ok


def _grandchildren(pid: int) -> list[int]:
    def children(p: int) -> list[int]:
        try:
            return [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:  # gone meanwhile
            return []

    return [g for c in children(pid) for g in children(c)]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_worker_killed_mid_export_is_a_one_line_error(tmp_path: Path) -> None:
    # the OOM killer takes a worker: the user gets `error: ...`, not a traceback
    from helpers import make_tree

    make_tree(tmp_path / "src", [f"c{i % 3}/{i:05d}.jpg" for i in range(600)])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from shardex.cli import main; main()",
            "export-dataset",
            str(tmp_path / "src"),
            *("-o", str(tmp_path / "out"), "-q", "--workers", "2", "--samples-per-shard", "2"),
            *("--validate", "decode"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
        workers = _grandchildren(proc.pid)  # the fork server's two workers
        time.sleep(0.01)
    assert len(workers) == 2, "the export ended before its workers were seen"
    time.sleep(0.5)
    os.kill(workers[-1], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert err.startswith("error: ")
    assert len(err.strip().splitlines()) == 1, err
    # what the message says to do works
    done = shardex.export(tmp_path / "src", tmp_path / "out", mode="resume", samples_per_shard=2)
    assert done.num_samples == 600
