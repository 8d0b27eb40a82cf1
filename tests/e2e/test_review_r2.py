"""Defects found in review round 2: what an export's checks may delete or let pass in its
output, the threads a failed merge keeps, a killed reader's download folders, and a Ray
address where something other than Ray answers."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import shardex
from helpers import files_of, image_bytes, make_tree
from shardex.engine.parts import MetadataJob, new_staging, put_part, write_metadata
from shardex.errors import ExportError, OutputExistsError
from shardex.storage import open_storage

RELS = [
    f"{split}/{cls}/img{i:02d}.jpg" for split in ("train", "val") for cls in "ab" for i in range(3)
]


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Path]:
    make_tree(tmp_path / "src", RELS)
    out = tmp_path / "out"
    shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    return tmp_path / "src", out


# -- 1. check_output deleted every temporary-named file of the output -------------------


@pytest.mark.parametrize(
    "name", [".notes.txt.tmp-1a2b", "reports/.summary.csv.tmp-77", "train/.my.json.tmp-0"]
)
@pytest.mark.parametrize("mode", ["overwrite", "resume", "error"])
def test_a_users_file_named_like_an_unfinished_write_is_refused_and_kept(
    exported: tuple[Path, Path], name: str, mode: str
) -> None:
    """A program of the user's writing ``NAME`` the way shardex does (``.NAME.tmp-X``)
    leaves a file the old check deleted with every overwrite; now it is a foreign file."""
    src, out = exported
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(b"the user's half-written file")
    before = files_of(out)
    with pytest.raises(OutputExistsError) as refused:
        shardex.export(src, out, samples_per_shard=4, workers=1, mode=mode)
    message = str(refused.value)
    assert "\n" not in message
    assert f"'{name}'" in message, message
    assert "did not write" in message, message
    assert files_of(out) == before  # the user's file and the committed export


def test_a_killed_exports_unfinished_writes_still_go(exported: tuple[Path, Path]) -> None:
    src, out = exported
    shard = sorted((out / "train").glob("images-*.tar"))[0]
    left = shard.with_name(f".{shard.name}.tmp-0badf00d")  # a write a kill cut short
    left.write_bytes(b"half a tar")
    shardex.export(src, out, samples_per_shard=4, workers=1, mode="overwrite")
    assert not left.exists()
    assert shardex.verify(out).ok


# -- 2. a user's own .shardex-staging/ ---------------------------------------------------


@pytest.mark.parametrize(
    "name", [".shardex-staging/notes.txt", ".shardex-staging/images-0123abcd-000000.tar"]
)
def test_a_users_own_staging_folder_is_foreign(tmp_path: Path, name: str) -> None:
    make_tree(tmp_path / "src", RELS)
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True)
    (out / name).write_bytes(b"mine")
    with pytest.raises(OutputExistsError) as refused:
        shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    assert f"'{name}'" in str(refused.value)
    assert files_of(out) == {name: b"mine"}  # nothing written, nothing deleted


def test_a_users_staging_folder_beside_an_export_survives_an_overwrite(
    exported: tuple[Path, Path],
) -> None:
    src, out = exported
    mine = out / ".shardex-staging" / "train" / "images-0123abcd-000000.tar"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"mine")
    with pytest.raises(OutputExistsError, match="shardex-staging"):
        shardex.export(src, out, samples_per_shard=4, workers=1, mode="overwrite")
    assert mine.read_bytes() == b"mine"


# -- 3. the threads of a failed merge ----------------------------------------------------


def test_a_failed_merge_leaves_no_thread_behind_while_its_error_is_held(tmp_path: Path) -> None:
    """A merge that fails part-way (the rows' columns differ) raises; the caller holds the
    error (its traceback holds the merge's frame): no reading thread may stay alive."""
    storage = open_storage(tmp_path / "out")
    staging = new_staging()
    names = [put_part(storage, staging, pa.table({"k": [i]}), {}) for i in range(9)]
    names.insert(2, put_part(storage, staging, pa.table({"k": ["text"]}), {}))
    before = set(threading.enumerate())
    job = MetadataJob(storage, "metadata.parquet", tuple(("part", n) for n in names))
    with pytest.raises(ExportError, match="columns differ") as failed:
        write_metadata(job)
    assert failed.value.__traceback__ is not None  # held, frames and all
    assert [t.name for t in threading.enumerate() if t not in before] == []
    assert not (tmp_path / "out" / "metadata.parquet").exists()


def test_a_users_own_staging_folder_on_object_storage_is_foreign(tmp_path: Path, s3: Any) -> None:
    make_tree(tmp_path / "src", RELS)
    out = open_storage(s3.child("out"), s3.direct)
    name = ".shardex-staging/0123456789ab/notes.txt"  # a run's folder, not a name it stages
    out.put(name, b"mine")
    with pytest.raises(OutputExistsError, match=re.escape(repr(name))):
        shardex.export(tmp_path / "src", s3.child("out"), storage_options=s3.direct, workers=1)
    assert list(out.list()) == [name]
    assert out.get(name) == b"mine"


# -- 4. a tar copy's short write (a full disk, a file size limit) -------------------------


def _tiny_tar(count: int, prefix: str = "s") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(count):
            for ext, data in (("jpg", image_bytes(i)), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{prefix}{i:04d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_tar_copy_cut_short_by_its_disk_is_not_read_past_what_it_holds(
    tmp_path: Path, s3: Any
) -> None:
    """A write of the scan's copy that the disk takes only in part (``write`` returns
    fewer bytes: a disk filling up, here a file size limit) must not count the rest as
    held: the shards read those members from the object, and the export is the same."""
    tar = _tiny_tar(400)
    limit = 200 << 10
    assert len(tar) > 3 * limit  # a window of the scan crosses the limit
    open_storage(s3.child("short"), s3.direct).put("part-0.tar", tar)
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
    lock = ".shardex-lock"
    assert {n: d for n, d in files_of(tmp_path / "limited").items() if n != lock} == {
        n: d for n, d in files_of(tmp_path / "clean").items() if n != lock
    }


# -- 5. tar copies and the room others need on their disk -------------------------------

_IN_TMPFS = """
mount -t tmpfs -o size="$1" none "$2" && mkdir "$2/tmp" && cd "$2" && shift 2 &&
TMPDIR="$PWD/tmp" exec "$@"
"""
#: An export in a child process (the copies' reserve scaled down with the small disk:
#: with the real 1 GiB the same happens for tars of more than 1 GiB).
_EXPORT = (
    "import json, sys\n"
    "import shardex\n"
    "from shardex.sources import objecttars\n"
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
    disk: Path, room: int, s3: Any, source: str, keep: str, out: str, reserve: int
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


def _upload_tars(s3: Any, prefix: str, count: int, samples: int) -> tuple[str, int]:
    tars = {f"part-{t}.tar": _tiny_tar(samples, f"t{t}_") for t in range(count)}
    storage = open_storage(s3.child(prefix), s3.direct)
    for name, data in tars.items():
        storage.put(name, data)
    return s3.child(f"{prefix}/"), sum(map(len, tars.values()))


def test_tar_copies_leave_room_for_a_local_output_on_their_disk(
    tmp_path: Path, s3: Any, small_disk: Path
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
    tmp_path: Path, s3: Any, small_disk: Path
) -> None:
    """A scratch folder with room for the export's own files (pass 1's spill, the index
    runs: ~0.6 MB for these 3,000 samples) and for a copy of one tar, not for both: the
    copy must not take the spill's room (it failed "cannot write the export's scratch
    files ... No space left on device"). The output is on another disk."""
    source, total = _upload_tars(s3, "spill", 2, 1500)
    shardex.export(source, tmp_path / "clean", source_storage_options=s3.direct, workers=1)
    room = total // 2 + (250 << 10)  # one tar, and less than the spill beside it
    for keep in ("none", "copies"):
        out = str(tmp_path / keep)
        done = _export_on_small_disk(small_disk, room, s3, source, keep, out, 64 << 10)
        assert done.returncode == 0, (keep, done.stderr[-1500:])
        got, want = files_of(Path(out)), files_of(tmp_path / "clean")
        assert {n: d for n, d in got.items() if n != ".shardex-lock"} == {
            n: d for n, d in want.items() if n != ".shardex-lock"
        }
