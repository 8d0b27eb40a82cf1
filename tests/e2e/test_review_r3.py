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
