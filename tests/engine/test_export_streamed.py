"""The streamed export (pass 1 batch by batch, splits spilled to local scratch, index files
streamed) writes the same files whether the batches name files or hold their bytes in
memory, also when batches differ in their columns, keys repeat across batches and samples
are left out; its memory does not grow with the samples; and its scratch space goes away,
also after a kill."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
from helpers import (
    Inlined,
    files_but_the_lock,
    kill_once_shards_appear,
    labelled_tar,
    peak_rss_kb,
)
from shardex.backends.webdataset.index_sink import IndexSink
from shardex.errors import BadSampleError, DuplicateKeyError, SourceError
from shardex.format.index import build_keys_from_hashes, build_samples, to_npy_bytes
from shardex.refs.scan import LeftOut, SampleStream, ScanBatch, build_table, file_member
from shardex.sources.base import Source
from shardex.storage.local import LocalStorage
from shardex.storage.scratch import PREFIX
from shardex.testing import make_image


class _Batches(Source):
    """Batches as a source may give them: columns that come and go, ints then floats."""

    kind: ClassVar[str] = "batches"

    def __init__(
        self, root: Path, keys: list[list[str]], labels: bool = True, left_out: bool = True
    ) -> None:
        self.uri = str(root)
        self._root, self._keys, self._labels, self._left_out = root, keys, labels, left_out

    def stream(self) -> SampleStream:
        return SampleStream(self._batches(), ("cat", "dog", "eel") if self._labels else None)

    def _batches(self) -> Iterator[ScanBatch]:
        n = 0
        for b, keys in enumerate(self._keys):
            members, originals = [], []
            for _ in keys:
                path = self._root / f"{n:04d}.jpg"
                path.write_bytes(make_image(n))
                members.append([file_member(str(path), path.stat().st_size, "jpg")])
                originals.append(str(path))
                n += 1
            k = len(keys)
            meta = {
                # ints in the first batch, floats after: joined as floats
                "score": pa.array(list(range(k)) if b == 0 else [i + 0.5 for i in range(k)]),
                "emb": pa.array([[float(i), 1.0, 2.0] for i in range(k)]),  # one length
                "tags": pa.array([["x"] * (i % 3) for i in range(k)]),  # lengths differ
            }
            if b == 1:
                meta["note"] = pa.array([f"n{i}" for i in range(k)])  # only this batch
            table = build_table(
                keys,
                originals,
                members,
                labels=[i % 3 for i in range(k)] if self._labels else None,
                metadata=pa.table(meta),
                invalid=["gone away" if b == 2 and i == 1 else None for i in range(k)],
            )
            left = [LeftOut("x/bad.heic", "not an image", "bad")] if b == 1 else []
            yield ScanBatch(table, tuple(left if self._left_out else []))


_KEYS = [
    ["a/0", "a/1", "a/2", "A/3", "a/4"],
    ["b/0", "a/1", "b/2", "A/0", "b/4", "b/5"],  # a/1 again; A/0 differs from a/0 by case
    ["c/0", "c/1", "b/2", "a/0", "A/3"],  # c/1 left out by the source; the rest again
]


def _both(tmp_path: Path, keys: list[list[str]], **opts: object) -> tuple[Path, Path]:
    """The batches exported as files, and with their bytes in memory (pinned)."""
    files, inline = tmp_path / "files", tmp_path / "inline"
    shardex.export(_Batches(tmp_path / "s1", keys), files, **opts)  # type: ignore[arg-type]
    src = Inlined(_Batches(tmp_path / "s1", keys))
    shardex.export(src, inline, **opts)  # type: ignore[arg-type]
    return files, inline


@pytest.fixture(autouse=True)
def _sources(tmp_path: Path) -> None:
    (tmp_path / "s1").mkdir()
    (tmp_path / "s2").mkdir()


@pytest.mark.parametrize(
    "opts",
    [
        {"samples_per_shard": 3},
        {"samples_per_shard": 2, "split_fractions": {"train": 0.6, "val": 0.4}, "workers": 2},
        {"samples_per_shard": 4, "max_shard_bytes": 3000, "labels": False},
    ],
    ids=["single", "fractions-2-workers", "by-bytes-no-labels"],
)
def test_batches_of_files_or_of_bytes_in_memory_give_the_same_export(
    tmp_path: Path, opts: dict[str, object]
) -> None:
    streamed, inline = _both(tmp_path, _KEYS, on_error="skip", **opts)
    assert files_but_the_lock(streamed) == files_but_the_lock(inline)
    errors = pa.parquet.read_table(streamed / "errors.parquet").to_pylist()
    reasons = [(e["key"], e["reason"].split(" (")[0].split(":")[0]) for e in errors]
    assert reasons == [
        ("bad", "not an image"),
        ("a/1", "duplicate key 'a/1'"),
        ("A/0", "duplicate key 'A/0'"),
        ("c/1", "gone away"),
        ("b/2", "duplicate key 'b/2'"),
        ("a/0", "duplicate key 'a/0'"),
        ("A/3", "duplicate key 'A/3'"),
    ]
    config = shardex.read_config(streamed)
    keys = set()
    for split in config.splits:
        ds = shardex.open_dataset(streamed, split=split)
        names = ds.keys()  # type: ignore[attr-defined]
        keys |= {ds.get(k)["__key__"] for k in names}  # type: ignore[attr-defined]
    assert keys == {"a/0", "a/2", "A/3", "a/4", "b/0", "b/4", "b/5", "c/0", "a/1", "b/2"}
    assert shardex.verify(streamed).ok


@pytest.mark.parametrize(
    ("keys", "error", "message"),
    [
        (_KEYS, BadSampleError, "'x/bad.heic': not an image; fix the source"),
        (_KEYS[:2], DuplicateKeyError, "'a/1' (also used by"),
        ([["a", "b"], ["c", "B"]], DuplicateKeyError, "'B': differs only by case from 'b'"),
        ([["a", "b"], ["c", "x/../y"]], BadSampleError, "unsafe key 'x/../y'"),
    ],
)
def test_batches_of_files_or_of_bytes_in_memory_are_refused_alike(
    tmp_path: Path, keys: list[list[str]], error: type[Exception], message: str
) -> None:
    messages = []
    for inline in (False, True):
        src: Source = _Batches(tmp_path / "s1", keys, left_out=keys is _KEYS)
        with pytest.raises(error) as info:
            shardex.export(Inlined(src) if inline else src, tmp_path / f"out{inline}")
        messages.append(str(info.value))
        assert not (tmp_path / f"out{inline}" / "config.yaml").exists()
    assert messages[0] == messages[1]
    assert message in messages[0]


@settings(max_examples=25, deadline=None)
@given(
    shards=st.lists(
        st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40), min_size=0, max_size=6
    ),
    repeat=st.booleans(),
)
def test_index_files_are_those_of_whole_arrays(shards: list[list[int]], repeat: bool) -> None:
    hashes = [np.array(s, np.uint64) for s in shards]
    if repeat and hashes:  # equal hashes keep sample order
        hashes = [np.full(len(h), 7, np.uint64) for h in hashes]
    records = [
        build_samples(np.full(len(h), k, np.uint32), np.arange(len(h)), np.ones(len(h)), h)
        for k, h in enumerate(hashes)
    ]
    with tempfile.TemporaryDirectory() as d, IndexSink() as sink:
        for r, h in zip(records, hashes, strict=True):
            sink.add(r, h)
        storage = LocalStorage(d)
        sink.put(storage, "s.npy", "k.npy")
        every = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        samples = np.concatenate(records) if records else build_samples(*[np.zeros(0)] * 4)
        assert (Path(d) / "s.npy").read_bytes() == to_npy_bytes(samples)
        assert (Path(d) / "k.npy").read_bytes() == to_npy_bytes(build_keys_from_hashes(every))
        assert np.load(io.BytesIO((Path(d) / "k.npy").read_bytes())).shape == (2, len(every))


def _tar(path: Path, n: int) -> Path:
    import tarfile

    tiny = make_image(0, size=(4, 4))
    with tarfile.open(path, "w") as tf:
        for i in range(n):
            for name, data in ((f"s{i:06d}.jpg", tiny), (f"s{i:06d}.cls", b"3")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def test_an_export_holds_memory_flat_whatever_the_source_size(tmp_path: Path) -> None:
    from shardex.sources import TarSource

    opts = {"workers": 1, "samples_per_shard": 500}  # written in this process: traced too
    shardex.export(TarSource(_tar(tmp_path / "warm.tar", 100)), tmp_path / "warm", **opts)
    peaks = {}
    for name, n in {"small": 2_000, "large": 20_000}.items():
        source = TarSource(_tar(tmp_path / f"{name}.tar", n), batch_size=500)
        tracemalloc.start()
        try:
            shardex.export(source, tmp_path / name, **opts)  # type: ignore[arg-type]
            peaks[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(shardex.open_dataset(tmp_path / name)) == n
    # ten times the samples, the same peak (a whole-table pass once took 1.2x, its
    # Python objects alone)
    assert peaks["large"] < 1.1 * peaks["small"], peaks


def _scratch() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}*")}


def _image_tar(root: Path, count: int) -> Path:
    """A folder holding one tar of ``count`` small JPEGs (a source that streams)."""
    import tarfile

    root.mkdir()
    with tarfile.open(root / "a.tar", "w") as tf:
        for i in range(count):
            data = make_image(i % 50)
            info = tarfile.TarInfo(f"k{i:05d}.jpg")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return root


def test_scratch_space_goes_after_an_export_an_error_and_a_kill(tmp_path: Path) -> None:
    ours = f"{PREFIX}{os.getpid()}-"
    shardex.export(_Batches(tmp_path / "s1", _KEYS), tmp_path / "ok", on_error="skip")
    with pytest.raises(BadSampleError):
        shardex.export(_Batches(tmp_path / "s2", _KEYS), tmp_path / "refused")
    assert not any(n.startswith(ours) for n in _scratch())
    # a killed export leaves its scratch folder: the next export removes it
    root = _image_tar(tmp_path / "tars", 3000)
    code = "import sys, shardex; shardex.export(sys.argv[1], sys.argv[2], samples_per_shard=10)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(root), str(tmp_path / "k")], env=env)
    mine = f"{PREFIX}{proc.pid}-"
    deadline = time.monotonic() + 60
    while not any(n.startswith(mine) for n in _scratch()) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert any(n.startswith(mine) for n in _scratch())
    shardex.export(_Batches(tmp_path / "s1", _KEYS), tmp_path / "after", on_error="skip")
    assert not any(n.startswith(mine) for n in _scratch())


def test_a_streamed_export_killed_while_writing_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    """SIGKILL once shards are being written (a tar source: the streamed path), then
    ``mode="resume"``: the output equals an uninterrupted export's, file for file."""
    root = _image_tar(tmp_path / "tars", 3000)
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    shardex.export(str(root), clean, samples_per_shard=10, workers=2)
    code = (
        "import sys, shardex; "
        "shardex.export(sys.argv[1], sys.argv[2], samples_per_shard=10, workers=2)"
    )
    kill_once_shards_appear(code, [str(root), str(killed)], killed)
    shardex.export(str(root), killed, samples_per_shard=10, workers=2, mode="resume")
    assert files_but_the_lock(killed) == files_but_the_lock(clean)


class _Columns(Source):
    """Batches of two samples; each batch's labels and splits given or left out (None)."""

    kind: ClassVar[str] = "columns"

    def __init__(self, root: Path, batches: list[tuple[list[int] | None, list[str] | None]]):
        self.uri, self._root, self._spec = str(root), root, batches

    def stream(self) -> SampleStream:
        return SampleStream(self._batches(), ("cat", "dog"))

    def _batches(self) -> Iterator[ScanBatch]:
        for b, (labels, splits) in enumerate(self._spec):
            keys, members = [f"{b}/{i}" for i in range(2)], []
            for i in range(2):
                path = self._root / f"{b}-{i}.jpg"
                path.write_bytes(make_image(2 * b + i))
                members.append([file_member(str(path), path.stat().st_size, "jpg")])
            table = build_table(keys, keys, members, labels=labels)
            if splits is not None:
                table = table.append_column("split", pa.array(splits, pa.string()))
            yield ScanBatch(table, ())


@pytest.mark.parametrize(
    "batches",
    [
        [(None, None), ([0, 1], None)],  # labels only from the second batch on
        [([0, None], None), (None, None), ([None, 1], None)],
        [([0, 1], ["train", "val"]), ([1, 0], None)],  # a batch without splits
    ],
    ids=["labels-late", "labels-missing", "splits-missing"],
)
def test_batches_lacking_labels_or_splits_export_alike_from_files_or_memory(
    tmp_path: Path, batches: list[tuple[list[int] | None, list[str] | None]]
) -> None:
    out = {}
    for inline in (False, True):
        target = tmp_path / f"out{inline}"
        src: Source = _Columns(tmp_path / "s1", batches)
        shardex.export(
            Inlined(src) if inline else src, target, samples_per_shard=2, on_error="skip"
        )
        out[inline] = files_but_the_lock(target)
    assert out[True] == out[False]
    ds = shardex.open_dataset(
        tmp_path / "outTrue", split=next(iter(shardex.read_config(tmp_path / "outTrue").splits))
    )
    assert len(ds) > 0


def test_a_split_column_from_a_later_batch_on_is_refused_in_one_line(tmp_path: Path) -> None:
    src = _Columns(tmp_path / "s1", [([0, 1], None), ([0, 1], ["train", "val"])])
    with pytest.raises(SourceError, match=r"split of sample '1/0' \(number 2\)") as info:
        shardex.export(src, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out" / "config.yaml").exists()


class _Breaks(_Columns):
    """Two good batches, then the source fails (a damaged file found mid-scan)."""

    def _batches(self) -> Iterator[ScanBatch]:
        batches = super()._batches()
        yield next(batches)
        yield next(batches)
        raise SourceError("the source broke after two batches")


def test_a_source_failing_mid_scan_leaves_no_file_open(tmp_path: Path) -> None:
    import gc

    src = _Breaks(tmp_path / "s1", [([0, 1], None), ([1, 0], None)])
    with pytest.raises(SourceError, match="broke after two batches"):
        shardex.export(src, tmp_path / "out")
    gc.collect()  # an unclosed scratch file warns here (an error: filterwarnings)
    assert not (tmp_path / "out" / "config.yaml").exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/bin/mount").exists(), reason="mounts a small tmpfs"
)
def test_a_full_temporary_folder_is_a_one_line_error(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        (full / "filler").write_bytes(b"\0" * (60 << 10))
        root = tmp_path / "images"
        for i in range(40):
            (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            (root / f"c{i % 2}" / f"{i}.jpg").write_bytes(make_image(i))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(full)}
        cli = [sys.executable, "-m", "shardex.cli", "export-dataset", str(root)]
        proc = subprocess.run(
            [*cli, "-o", str(tmp_path / "out")], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 1, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1, proc.stderr
        assert "No space left on device; set TMPDIR" in lines[0]
        assert "Traceback" not in proc.stderr
        assert os.listdir(full) == ["filler"]  # its scratch folder went
        assert not (tmp_path / "out" / "config.yaml").exists()
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_exports_starting_together_never_take_each_others_scratch_for_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every export first removes stale scratch folders: one that is being made must never
    look stale to it (its lock file free for a moment), or the new export fails with
    'cannot write the export's scratch files ... No such file or directory'."""
    import threading

    from shardex.storage import scratch as scratch_module

    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    errors: list[BaseException] = []
    done = threading.Event()

    def export_like() -> None:
        for _ in range(500):
            try:
                with scratch_module.scratch("t") as folder:
                    (folder / "part").write_bytes(b"x")
            except BaseException as exc:
                errors.append(exc)
                return

    def cleaner() -> None:
        while not done.is_set():
            scratch_module.remove_stale()

    threads = [threading.Thread(target=export_like) for _ in range(3)]
    sweeping = threading.Thread(target=cleaner)
    sweeping.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    sweeping.join()
    assert errors == []
    assert list(root.iterdir()) == []


def test_a_live_export_keeps_its_scratch_whatever_its_process_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staleness is the scratch folder's lock, not its process ID: a live export in
    another PID namespace (its ID unknown here) keeps its folder; a killed export's folder
    goes even when its ID now belongs to a live process."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = tmp_path / "tmp"  # a temporary folder of its own: no other process looks here
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    elsewhere = root / f"{PREFIX}{dead.pid}-run-elsewhere"  # a live export, other namespace
    reused = root / f"{PREFIX}{os.getppid()}-run-reused"  # killed; its ID is live now
    for folder in (elsewhere, reused):
        folder.mkdir()
        (folder / ".lock").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, os; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
            str(elsewhere / ".lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"locked\n"
        shardex.export(_Batches(tmp_path / "s1", _KEYS), tmp_path / "a", on_error="skip")
        assert elsewhere.is_dir()
        assert not reused.exists()
    finally:
        holder.communicate(b"")
    shardex.export(_Batches(tmp_path / "s2", _KEYS), tmp_path / "b", on_error="skip")
    assert not elsewhere.exists()  # its export is gone: the lock is free


class _Typed(_Columns):
    """Two batches whose column ``m`` holds text, then numbers."""

    def _batches(self) -> Iterator[ScanBatch]:
        for b, batch in enumerate(super()._batches()):
            values = ["a", "b"] if b == 0 else [1, 2]
            yield ScanBatch(batch.table.append_column("m", pa.array(values)), ())


@pytest.mark.parametrize("inline", [False, True])
def test_a_column_of_other_types_in_other_batches_is_a_source_error(
    tmp_path: Path, inline: bool
) -> None:
    src: Source = _Typed(tmp_path / "s1", [(None, None), (None, None)])
    with pytest.raises(SourceError, match="different types in different batches") as info:
        shardex.export(Inlined(src) if inline else src, tmp_path / "out")
    assert "string vs int64" in str(info.value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out" / "config.yaml").exists()


def _peak_rss_kb(tar: Path, out: Path) -> int:
    """Peak resident memory (VmHWM) of a fresh process that exports ``tar`` (a local
    export holds none of its pass-1 scratch in memory: only a Ray driver does)."""
    code = "import sys, shardex\nshardex.export(sys.argv[1], sys.argv[2], workers=1)"
    return peak_rss_kb(code, [str(tar), str(out)])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc VmHWM")
def test_peak_rss_of_a_tar_export_does_not_grow_with_its_samples(tmp_path: Path) -> None:
    """Peak RSS (not traced Python memory) of exports of 20k and 100k tiny tar samples:
    the streamed export's stays within 20 MB (measured: 174 MB at 20k, 172 MB at 120k;
    197-202 MB and 199-200 MB in session 12, once 210 and 227 MB at a load of 6, the
    allocators' timing; a whole-table pass once grew about 0.45 KB a sample)."""
    peaks = {}
    for n in (20_000, 100_000):
        tar = labelled_tar(tmp_path / f"{n}.tar", n, make_image(1))
        peaks[n] = _peak_rss_kb(tar, tmp_path / f"out{n}")
    assert peaks[100_000] - peaks[20_000] < 20_000, peaks


@pytest.mark.parametrize(
    ("spill_bytes", "hash_records"),
    [(0, 0), (1, 3), (1 << 20, 1 << 20)],
    ids=["all-on-disk", "memory-then-disk", "all-in-memory"],
)
def test_pass_one_scratch_in_memory_or_on_disk_writes_the_same_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill_bytes: int, hash_records: int
) -> None:
    """The first rows of each split's spill and the first key hashes are held in memory
    (the driver of a smaller export writes and reads none back); past the bounds they go
    to scratch files. Repeated keys across batches are found either way."""
    import shardex.engine.spill as spill
    import shardex.format.runs as runs

    monkeypatch.setattr(spill, "MEMORY_BYTES", spill_bytes)
    monkeypatch.setattr(spill, "HELD_LOCALLY", True)  # as a Ray driver holds them
    monkeypatch.setattr(runs, "MEMORY_RECORDS", hash_records)
    files, inline = _both(
        tmp_path, _KEYS, on_error="skip", samples_per_shard=2, max_shard_bytes=3000
    )
    assert files_but_the_lock(files) == files_but_the_lock(inline)


def test_hash_runs_held_in_memory_come_back_as_those_on_disk(tmp_path: Path) -> None:
    from shardex.format.runs import HashRuns

    dtype = np.dtype([("h", "<u8"), ("row", "<i8")])
    rng = np.random.default_rng(5)
    batches = []
    for start in range(0, 5000, 700):
        records = np.empty(700, dtype)
        records["h"] = rng.integers(0, 2**64 - 1, 700, dtype=np.uint64) | np.uint64(1)
        records["h"][::50] = np.uint64(12345)  # ties: kept in the order they came
        records["row"] = np.arange(start, start + 700)
        batches.append(records)
    got = {}
    for memory in (0, 1500, 10_000):
        folder = tmp_path / str(memory)
        folder.mkdir()
        runs = HashRuns(folder, "keys", dtype, memory=memory)
        for records in batches:
            runs.add(records)
        got[memory] = np.concatenate(list(runs.sorted_runs()))
        assert bool(list(folder.iterdir())) == (memory < 4900)  # files only past the bound
        assert np.array_equal(np.concatenate(list(runs.sorted_runs())), got[memory])  # again
        runs.remove()
        assert not list(folder.iterdir())
    whole = np.concatenate(batches)
    expected = whole[np.argsort(whole["h"], kind="stable")]
    assert all(np.array_equal(g, expected) for g in got.values())


def test_spilled_rows_past_the_memory_bound_go_to_files_in_order(tmp_path: Path) -> None:
    from shardex.engine.spill import Budget, Spill

    tables = [pa.table({"key": [f"k{i}-{j}" for j in range(300)]}) for i in range(6)]
    tables[3] = tables[3].append_column("x", pa.array(range(300)))  # a segment of its own
    for memory, on_disk in ((0, True), (1, True), (1 << 24, False)):  # bytes in memory
        folder = tmp_path / str(memory)
        folder.mkdir()
        spill = Spill(folder, "split0000", Budget(memory))
        for t in tables:
            spill.append(t)
        back = list(spill.tables())
        assert [k for t in back for k in t.column("key").to_pylist()] == [
            k for t in tables for k in t.column("key").to_pylist()
        ]
        assert bool(list(folder.iterdir())) == on_disk
        spill.remove()
        assert not list(folder.iterdir())


def test_the_splits_spills_share_one_memory_budget(tmp_path: Path) -> None:
    """Many splits do not multiply the memory held: once one split's rows took the
    budget, the others' go to files."""
    from shardex.engine.spill import Budget, Spill

    folder = tmp_path / "scratch"
    folder.mkdir()
    budget = Budget(4096)
    spills = [Spill(folder, f"split{k:04d}", budget) for k in range(3)]
    table = pa.table({"key": [f"key-{i:06d}" for i in range(2000)]})  # > 4 KiB packed
    for spill in spills:
        spill.append(table)
        spill.append(table)
    assert budget.left <= 0
    on_disk = sorted(p.name for p in folder.iterdir())
    # the first split's first segment stayed in memory; the others' rows are all in files
    assert on_disk == ["split0000-0001.arrows", "split0001-0000.arrows", "split0002-0000.arrows"]
    for spill in spills:
        assert sum(t.num_rows for t in spill.tables()) == 4000
        spill.remove()
