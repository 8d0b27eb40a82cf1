"""Tars on object storage (``shardex.storage.fetch.tars``): the scan's copies of what it
reads through, and what they may take of their disk (a short write, the room a local
output and the export's own scratch files need); a failed export stops its scans and
leaves no copy; hop-size members among small samples are fetched once."""

from __future__ import annotations

import json
import multiprocessing.util
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

import shardex
from helpers import files_but_the_lock, files_of, image_bytes, open_files_under, tar_bytes
from shardex.errors import SourceError
from shardex.storage import ObjectStorage
from tests.support.proxy import RequestHead
from tests.support.s3data import S3Location, noise_jpeg, tars_here_and_on_s3, upload


def _tiny_tar(count: int, prefix: str = "s") -> bytes:
    """A WebDataset tar of ``count`` samples of a tiny JPEG and a label (read through by
    the scan: its bytes are kept in a copy)."""
    return tar_bytes(
        (
            (f"{prefix}{i:05d}.{ext}", data)
            for i in range(count)
            for ext, data in (("jpg", image_bytes(i)), ("cls", str(i % 3).encode()))
        ),
        tarfile.USTAR_FORMAT,
    )


# -- a tar copy's short write (a full disk, a file size limit) ---------------------------


def test_a_tar_copy_cut_short_by_its_disk_is_not_read_past_what_it_holds(
    tmp_path: Path, s3: S3Location
) -> None:
    """A write of the scan's copy that the disk takes only in part (``write`` returns
    fewer bytes: a disk filling up, here a file size limit) must not count the rest as
    held: the shards read those members from the object, and the export is the same."""
    tar = _tiny_tar(400)
    limit = 200 << 10
    assert len(tar) > 3 * limit  # a window of the scan crosses the limit
    ObjectStorage(s3.child("short"), s3.direct).put("part-0.tar", tar)
    source = s3.child("short/")
    opts = {"samples_per_shard": 25, "workers": 1}
    shardex.export(source, tmp_path / "clean", source_storage_options=s3.direct, **opts)
    assert max(len(d) for d in files_of(tmp_path / "clean").values()) < limit
    code = (
        "import json, resource, signal, sys\n"
        "import shardex\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG past it, a short write across\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[4]), resource.RLIM_INFINITY))\n"
        "shardex.export(sys.argv[1], sys.argv[2], samples_per_shard=25, workers=1,\n"
        "               source_storage_options=json.loads(sys.argv[3]))\n"
    )
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp_path / "tmp")}
    args = [source, str(tmp_path / "limited"), json.dumps(s3.direct), str(limit)]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert files_but_the_lock(tmp_path / "limited") == files_but_the_lock(tmp_path / "clean")


# -- tar copies and the room others need on their disk -----------------------------------

_IN_TMPFS = """
mount -t tmpfs -o size="$1" none "$2" && mkdir "$2/tmp" && cd "$2" && shift 2 &&
TMPDIR="$PWD/tmp" exec "$@"
"""
#: An export in a child process (the copies' reserve scaled down with the small disk:
#: with the real 1 GiB the same happens for tars of more than 1 GiB).
_EXPORT = (
    "import json, sys\n"
    "import shardex\n"
    "from shardex.storage.fetch import tars as objecttars\n"
    "objecttars.COPY_RESERVE = int(sys.argv[5])\n"
    "objecttars.KEEP_COPIES = sys.argv[3] == 'copies'\n"
    "shardex.export(sys.argv[1], sys.argv[4], workers=1,\n"
    "               source_storage_options=json.loads(sys.argv[2]))\n"
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    """A folder where a tmpfs can be mounted by a child in its own mount namespace."""
    mount = tmp_path / "disk"
    mount.mkdir()
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_TMPFS, "-",
         "1m", str(mount), "true"],
        capture_output=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr[-200:]!r}")
    return mount


def _export_on_small_disk(
    disk: Path, room: int, s3: S3Location, source: str, keep: str, out: str, reserve: int
) -> subprocess.CompletedProcess[str]:
    """``_EXPORT`` with ``$TMPDIR`` on a fresh tmpfs of ``room`` bytes at ``disk`` (also
    its working folder: a relative ``out`` is on it too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [source, json.dumps(s3.direct), keep, out, str(reserve)]
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_TMPFS, "-",
         f"{room >> 10}k", str(disk), sys.executable, "-c", _EXPORT, *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _upload_tars(s3: S3Location, prefix: str, count: int, samples: int) -> tuple[str, int]:
    """``count`` tars of ``samples`` each uploaded under ``prefix``: the source URL, and
    the tars' bytes in all."""
    tars = {f"part-{t}.tar": _tiny_tar(samples, f"t{t}_") for t in range(count)}
    upload(ObjectStorage(s3.child(prefix), s3.direct), tars)
    return s3.child(f"{prefix}/"), sum(map(len, tars.values()))


def test_tar_copies_leave_room_for_a_local_output_on_their_disk(
    tmp_path: Path, s3: S3Location, small_disk: Path
) -> None:
    """The scan's copies of the tars and a local output on the same disk: the copies must
    not take the room the shards need (a disk with room for the export, and for the
    copies or the shards but not both, failed with "No space left on device")."""
    source, total = _upload_tars(s3, "room", 3, 400)
    shardex.export(source, tmp_path / "clean", source_storage_options=s3.direct, workers=1)
    size = sum(map(len, files_of(tmp_path / "clean").values()))
    assert size > 0.9 * total
    # room for the export and its scratch, not for a second copy of the tars
    for keep in ("none", "copies"):
        done = _export_on_small_disk(
            small_disk, size + total // 2, s3, source, keep, "out", 256 << 10
        )
        assert done.returncode == 0, (keep, done.stderr[-1500:])
    # the copies were refused, and the warning said why
    assert "kept free and" in done.stderr, done.stderr[-1500:]
    assert "for the export's files" in done.stderr


def test_tar_copies_leave_room_for_the_exports_own_scratch_files(
    tmp_path: Path, s3: S3Location, small_disk: Path
) -> None:
    """A scratch folder with room for the export's own files (pass 1's spill, the index
    runs: ~0.6 MB for these 3,000 samples) and for a copy of one tar, not for both: the
    copy must not take the spill's room (it failed "cannot write the export's scratch
    files ... No space left on device"). The output is on another disk."""
    source, total = _upload_tars(s3, "spill", 2, 1500)
    shardex.export(source, tmp_path / "clean", source_storage_options=s3.direct, workers=1)
    room = total // 2 + (250 << 10)  # one tar, and less than the spill beside it
    for keep in ("none", "copies"):
        out = tmp_path / keep
        done = _export_on_small_disk(small_disk, room, s3, source, keep, str(out), 64 << 10)
        assert done.returncode == 0, (keep, done.stderr[-1500:])
        assert files_but_the_lock(out) == files_but_the_lock(tmp_path / "clean")


# -- the scans of a failed export --------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_a_failed_export_of_tars_on_s3_stops_its_scans_and_leaves_no_copy(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first tar is damaged while the scan threads of the next ones are under way
    (their requests slowed): when the export's error reaches the caller (who keeps it),
    the scans have stopped, no request follows, and no copy is left in the scratch nor
    held open (a deleted file's disk space), nothing in the output."""
    multiprocessing.util.get_temp_dir()  # its folder, made once a process: not in tmp
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where the export's scratch goes
    tars = {
        "part-0.tar": b"not a tar " * 300,
        "part-1.tar": _tiny_tar(1200, "a"),  # more than a handover of samples
        "part-2.tar": _tiny_tar(20, "b"),
    }
    upload(ObjectStorage(s3.child("failing"), s3.direct), tars)
    asked: list[float] = []

    def slowed(head: RequestHead) -> bool:
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
    assert open_files_under(tmp) == []
    assert list(tmp.iterdir()) == []
    assert not (tmp_path / "out" / "config.yaml").exists()
    assert "part-0.tar" in str(failure.value)  # the error was held all along


def test_tars_read_after_their_copies_closed_fail_instead_of_waiting(
    s3: S3Location, tmp_path: Path
) -> None:
    """A tar source's samples read after the scan's copies were closed (the export's scan
    over): one error, not a wait for ever on threads that stopped."""
    from shardex.sources import TarSource
    from shardex.storage.fetch import tars as objecttars

    tars = {f"part-{t}.tar": _tiny_tar(10, f"t{t}") for t in range(2)}
    upload(ObjectStorage(s3.child("late"), s3.direct), tars)
    source = TarSource(s3.child("late/"), s3.direct)
    with objecttars.copies_kept(tmp_path / "copies"):
        batches = iter(source.stream().batches)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="after its scan was stopped"):
        list(batches)
    assert time.monotonic() - started < 30
    assert list((tmp_path / "copies").iterdir()) == []


# -- what the scan fetches ---------------------------------------------------------------


def _mixed_tar(prefix: str, count: int) -> bytes:
    """Samples of a JPEG and a label, every fourth JPEG ~100 KB (hop-size, noise), the
    others tiny: the scan reads the tiny ones through, in small windows."""
    return tar_bytes(
        (
            (f"{prefix}{i:05d}.{ext}", data)
            for i in range(count)
            for ext, data in (
                ("jpg", noise_jpeg(i) if i % 4 == 0 else image_bytes(i)),
                ("cls", str(i % 7).encode()),
            )
        ),
        tarfile.USTAR_FORMAT,
    )


def test_hop_size_members_among_small_samples_are_fetched_once(
    s3: S3Location, tmp_path: Path
) -> None:
    """Tars where one sample in four holds a ~100 KB image and the rest are tiny: the
    export fetches each byte about once (1.12x before: each large member's start, and
    the small samples its shard's merged GET spanned, were fetched again), and writes
    the same shards as from the local tars."""
    tars = {f"part-{t}.tar": _mixed_tar(f"m{t}_", 80) for t in range(2)}
    total = sum(len(d) for d in tars.values())
    source = tars_here_and_on_s3(tars, tmp_path / "src", s3, "mixedcls")
    shardex.export(str(tmp_path / "src"), tmp_path / "local", samples_per_shard=10)
    s3.proxy.reset()
    shardex.export(source, tmp_path / "s3", samples_per_shard=10, source_storage_options=s3.counted)
    fetched = sum(r.body_bytes for r in s3.proxy.gets())
    assert fetched <= 1.02 * total, fetched / total

    def shards(out: Path) -> dict[str, bytes]:
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.tar")}

    assert shards(tmp_path / "s3") == shards(tmp_path / "local")
