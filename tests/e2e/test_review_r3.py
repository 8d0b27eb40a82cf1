"""Review round 3 (session 11): leftovers of killed readers in the cache, tar copies of a
failed export, copies freed as their shards are written."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

import pytest

import shardex
from helpers import image_bytes
from shardex.errors import SourceError
from shardex.storage import ObjectStorage
from shardex.storage.cache import LEGACY_AGE, remove_legacy_leftovers

_READ: Final = """
import json, sys
import shardex
ds = shardex.open_dataset(sys.argv[1], storage_options=json.loads(sys.argv[2]))
print(sorted(sample["__key__"] for sample in ds))
"""

_KEYS: Final = str([f"k{i}" for i in range(8)])


def _export(url: str, options: dict[str, Any]) -> None:
    data = {"key": [f"k{i}" for i in range(8)], "txt": [b"%d" % i for i in range(8)]}
    shardex.export(data, url, storage_options=options)


def _reader(url: str, options: dict[str, Any], cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "SHARDEX_CACHE_DIR": str(cache)}
    command = [sys.executable, "-c", _READ, url, json.dumps(options)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def _downloads(cache: Path) -> list[str]:
    """What ``index/`` holds beside the finished copies' folders (16 hex digits each)."""
    root = cache / "index"
    found = root.iterdir() if root.is_dir() else []
    return sorted(p.name for p in found if len(p.name) != 16 or p.name.startswith("."))


def _temporary(cache: Path) -> list[str]:
    """Every name in the cache that is not a finished copy."""
    return sorted(
        p.relative_to(cache).as_posix()
        for p in cache.rglob("*")
        if ".tmp-" in p.name or "download-" in p.name
    )


def _held_index(s3: Any, name: str) -> Any:
    """Requests for the samples index of export ``name``."""
    prefix = f"/{s3.url.rpartition('/')[2]}/{name}/"
    return lambda head: (
        head.method == "GET" and prefix in head.path and head.path.endswith("index-samples.npy")
    )


def _wait_for(check: Any, child: subprocess.Popen[str], limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert child.poll() is None, "the reader ended before it was stopped"
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_reader_killed_mid_download_leaves_nothing_in_the_cache_once_another_downloads(
    tmp_path: Path, s3: Any
) -> None:
    """SIGKILL while a reader downloads an export's index from object storage: its
    download is gone once the next reader downloads (here the same index, which it reads)."""
    _export(s3.child("a"), s3.direct)
    cache = tmp_path / "cache"
    s3.proxy.delay_next(1000, 30, when=_held_index(s3, "a"))
    try:
        child = _reader(s3.child("a"), s3.counted, cache)
        _wait_for(lambda: bool(_downloads(cache)), child)
        child.send_signal(signal.SIGKILL)
        child.communicate()
    finally:
        s3.proxy.clear_faults()
    assert _downloads(cache)  # what the kill left
    again = _reader(s3.child("a"), s3.direct, cache)
    assert again.communicate(timeout=300)[0].strip() == _KEYS
    assert again.returncode == 0
    assert _temporary(cache) == []
    assert len(list((cache / "index").iterdir())) == 1  # the finished copies' folder


def test_an_index_download_under_way_is_left_to_its_reader(tmp_path: Path, s3: Any) -> None:
    """A reader that downloads while another's download is under way (that reader stopped,
    SIGSTOP, mid-download) removes nothing of it; both read their export."""
    for name in "ab":
        _export(s3.child(name), s3.direct)
    cache = tmp_path / "cache"
    s3.proxy.delay_next(1, 3, when=_held_index(s3, "a"))
    slow = _reader(s3.child("a"), s3.counted, cache)
    try:
        _wait_for(lambda: bool(_downloads(cache)), slow)
        slow.send_signal(signal.SIGSTOP)
        under_way = _downloads(cache)
        other = _reader(s3.child("b"), s3.direct, cache)
        assert other.communicate(timeout=300)[0].strip() == _KEYS
        assert _downloads(cache) == under_way
        slow.send_signal(signal.SIGCONT)
        assert slow.communicate(timeout=300)[0].strip() == _KEYS
        assert slow.returncode == 0
    finally:
        s3.proxy.clear_faults()
        if slow.poll() is None:  # a failed check left it stopped
            slow.kill()
            slow.communicate()
    assert _temporary(cache) == []
    assert len(list((cache / "index").iterdir())) == 2


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _earlier_leftovers(cache: Path, age: float) -> list[Path]:
    """What readers before the download locks left when killed, as they named it: a
    partial index file ``.NAME.tmp-PID`` beside the copies, and a partial tensordict
    download folder ``.{digest}.tmp-RANDOM``; last changed ``age`` seconds ago."""
    index = cache / "index" / "0123456789abcdef" / "train"
    index.mkdir(parents=True)
    file = index / f".index-samples.npy.tmp-{_dead_pid()}"
    file.write_bytes(b"\x93NUMPY" + bytes(1000))
    folder = cache / "tensordict" / ".fedcba9876543210.tmp-k2j4_x8q"
    (folder / "x").mkdir(parents=True)
    (folder / "x" / "tensordict-0.memmap").write_bytes(bytes(4096))
    when = time.time() - age
    for path in (file, folder / "x" / "tensordict-0.memmap", folder / "x", folder):
        os.utime(path, (when, when))
    return [file, folder]


def test_earlier_readers_leftovers_go_once_a_reader_downloads(
    tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporary files and folders of killed readers of earlier versions (no lock) are
    removed by the next download once nothing changed in them for LEGACY_AGE; the
    finished copies stay."""
    _export(s3.url, s3.direct)
    cache = tmp_path / "cache"
    left = _earlier_leftovers(cache, age=LEGACY_AGE + 60)
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(cache))
    ds = shardex.open_dataset(s3.url, storage_options=s3.direct)
    assert sorted(s["__key__"] for s in ds) == [f"k{i}" for i in range(8)]
    assert [p for p in left if p.exists()] == []
    assert _temporary(cache) == []
    again = shardex.open_dataset(s3.url, storage_options=s3.direct)  # from the copies
    assert [s["txt"] for s in again] == [b"%d" % i for i in range(8)]


def test_earlier_readers_downloads_that_may_be_under_way_are_kept(tmp_path: Path) -> None:
    """An earlier reader's temporary file or folder changed recently may belong to a live
    download (nothing else tells): it stays; the same leftovers, older, go."""
    fresh, old = tmp_path / "fresh", tmp_path / "old"
    kept = _earlier_leftovers(fresh, age=LEGACY_AGE - 120)
    gone = _earlier_leftovers(old, age=LEGACY_AGE + 120)
    remove_legacy_leftovers(fresh)
    remove_legacy_leftovers(old)
    assert all(p.exists() for p in kept)
    assert [p for p in gone if p.exists()] == []


def _tiny_tar(prefix: str, count: int) -> bytes:
    """A WebDataset tar of ``count`` samples of a tiny JPEG and a label (read through by
    the scan: its bytes are kept in a copy)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(count):
            for ext, data in (("jpg", image_bytes(i)), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{prefix}{i:05d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _open_under(folder: Path) -> list[str]:
    """The files under ``folder`` this process holds open (deleted ones too)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_a_failed_export_of_tars_on_s3_stops_its_scans_and_leaves_no_copy(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first tar is damaged while the scan threads of the next ones are under way
    (their requests slowed): when the export's error reaches the caller (who keeps it),
    the scans have stopped, no request follows, and no copy is left in the scratch nor
    held open (a deleted file's disk space), nothing in the output."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where the export's scratch goes
    tars = {
        "part-0.tar": b"not a tar " * 300,
        "part-1.tar": _tiny_tar("a", 1200),  # more than a handover of samples
        "part-2.tar": _tiny_tar("b", 20),
    }
    storage = ObjectStorage(s3.child("failing"), s3.direct)
    for name, data in tars.items():
        storage.put(name, data)
    asked: list[float] = []

    def slowed(head: Any) -> bool:
        if head.method == "GET" and head.path.endswith("/part-1.tar"):
            asked.append(time.monotonic())
            return True
        return False

    s3.proxy.delay_next(10_000, 0.5, when=slowed)
    try:
        with pytest.raises(SourceError, match=r"part-0\.tar") as failure:
            shardex.export(
                s3.child("failing/"), tmp_path / "out", source_storage_options=s3.counted
            )
        failed = time.monotonic()
        assert asked, "the scan of part-1.tar had not begun"
        deadline = failed + 5
        while any(t.name == "shardex-tar-scan" for t in threading.enumerate()):
            assert time.monotonic() < deadline, "tar scans still run after the export failed"
            time.sleep(0.05)
        time.sleep(0.5)
        assert [t - failed for t in asked if t > failed + 1] == []
    finally:
        s3.proxy.clear_faults()
    assert _open_under(tmp) == []
    assert list(tmp.iterdir()) == []
    assert not (tmp_path / "out" / "config.yaml").exists()
    assert "part-0.tar" in str(failure.value)  # the error was held all along


def test_tars_read_after_their_copies_closed_fail_instead_of_waiting(
    s3: Any, tmp_path: Path
) -> None:
    """A tar source's samples read after the scan's copies were closed (the export's scan
    over): one error, not a wait for ever on threads that stopped."""
    from shardex.sources import TarSource, objecttars

    storage = ObjectStorage(s3.child("late"), s3.direct)
    for t in range(2):
        storage.put(f"part-{t}.tar", _tiny_tar(f"t{t}", 10))
    source = TarSource(s3.child("late/"), s3.direct)
    with objecttars.copies_kept(tmp_path / "copies"):
        batches = iter(source.stream().batches)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="after its scan was stopped"):
        list(batches)
    assert time.monotonic() - started < 30
    assert list((tmp_path / "copies").iterdir()) == []


def _mixed_tar(prefix: str, count: int) -> bytes:
    """Samples of a JPEG and a label, every fourth JPEG ~100 KB (hop-size, noise), the
    others tiny: the scan reads the tiny ones through, in small windows."""
    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(count):
            if i % 4 == 0:
                pixels = np.random.default_rng(i).integers(0, 256, (280, 280, 3), np.uint8)
                jpeg = io.BytesIO()
                Image.fromarray(pixels).save(jpeg, "JPEG", quality=95)
                image = jpeg.getvalue()
            else:
                image = image_bytes(i)
            for ext, data in (("jpg", image), ("cls", str(i % 7).encode())):
                info = tarfile.TarInfo(f"{prefix}{i:05d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_hop_size_members_among_small_samples_are_fetched_once(s3: Any, tmp_path: Path) -> None:
    """Tars where one sample in four holds a ~100 KB image and the rest are tiny: the
    export fetches each byte about once (1.12x before: each large member's start, and
    the small samples its shard's merged GET spanned, were fetched again), and writes
    the same shards as from the local tars."""
    tars = {f"part-{t}.tar": _mixed_tar(f"m{t}_", 80) for t in range(2)}
    total = sum(len(d) for d in tars.values())
    (tmp_path / "src").mkdir()
    storage = ObjectStorage(s3.child("mixedcls"), s3.direct)
    for name, data in tars.items():
        (tmp_path / "src" / name).write_bytes(data)
        storage.put(name, data)
    shardex.export(str(tmp_path / "src"), tmp_path / "local", samples_per_shard=10)
    s3.proxy.reset()
    shardex.export(
        s3.child("mixedcls/"),
        tmp_path / "s3",
        samples_per_shard=10,
        source_storage_options=s3.counted,
    )
    fetched = sum(r.body_bytes for r in s3.proxy.gets())
    assert fetched <= 1.02 * total, fetched / total

    def shards(out: Path) -> dict[str, bytes]:
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.tar")}

    assert shards(tmp_path / "s3") == shards(tmp_path / "local")
