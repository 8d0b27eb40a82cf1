"""Local copies of objects (``shardex.storage.cache``): a reader killed mid-download leaves
nothing in the cache once another downloads, a download under way is left to its reader,
and earlier readers' leftovers go once nothing changed in them for ``LEGACY_AGE``.

Two kinds of copies: an export's key table (under ``index/``: the samples index is read
by pages, see ``test_paged.py``) and a
tensordict_memmap export's runs (under ``tensordict/``). Real processes: readers in child
processes, SIGKILL and SIGSTOP, SeaweedFS behind the counting proxy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest

import shardex
from shardex.storage.cache import LEGACY_AGE, remove_legacy_leftovers
from tests.support.proxy import RequestHead
from tests.support.s3data import S3Location

_READ: Final = """
import json, sys
import shardex
ds = shardex.open_dataset(sys.argv[1], storage_options=json.loads(sys.argv[2]))
if sys.argv[3] == "lookup":  # the first lookup by key downloads the key table
    ds.get("k3")
print(sorted(sample["__key__"] for sample in ds))
"""

_KEYS: Final = [f"k{i}" for i in range(8)]


@dataclass(frozen=True)
class _Copies:
    """An export whose reader downloads copies into the cache folder ``folder``."""

    folder: str
    backend: str
    fields: dict[str, list[Any]]
    downloaded: Callable[[str], bool]  # whether a GET of this path is for such a copy
    lookup: bool = False  # whether the reader looks a key up (the key table's download)


_COPIES: Final = {
    "index": _Copies(
        "index",
        "webdataset",
        {"txt": [b"%d" % i for i in range(8)]},
        lambda path: path.endswith("index-keys.npy"),
        lookup=True,
    ),
    "tensordict": _Copies(
        "tensordict",
        "tensordict_memmap",
        {"x.npy": [np.full((64, 64), i) for i in range(8)]},
        lambda path: "/tensordict-" in path and not path.endswith("-keys.npy"),
    ),
}


@pytest.fixture(params=list(_COPIES))
def copies(request: pytest.FixtureRequest) -> _Copies:
    if request.param == "tensordict":
        pytest.importorskip("tensordict")
    return _COPIES[request.param]


def _export(copies: _Copies, url: str, options: dict[str, Any]) -> None:
    data = {"key": _KEYS, **copies.fields}
    shardex.export(data, url, backend=copies.backend, storage_options=options)


def _reader(
    url: str, options: dict[str, Any], cache: Path, copies: _Copies
) -> subprocess.Popen[str]:
    """A child process that reads the export at ``url`` and prints its sorted keys."""
    env = {**os.environ, "SHARDEX_CACHE_DIR": str(cache)}
    lookup = "lookup" if copies.lookup else "-"
    command = [sys.executable, "-c", _READ, url, json.dumps(options), lookup]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def _read_all(reader: subprocess.Popen[str]) -> None:
    """The reader printed every key and ended well."""
    assert reader.communicate(timeout=300)[0].strip() == str(_KEYS)
    assert reader.returncode == 0


def _downloads(cache: Path, copies: _Copies) -> list[str]:
    """What the copies' folder holds beside the finished copies (16 hex digits each)."""
    root = cache / copies.folder
    found = root.iterdir() if root.is_dir() else []
    return sorted(p.name for p in found if len(p.name) != 16 or p.name.startswith("."))


def _temporary(cache: Path) -> list[str]:
    """Every name in the cache that is not a finished copy."""
    return sorted(
        p.relative_to(cache).as_posix()
        for p in cache.rglob("*")
        if ".tmp-" in p.name or "download-" in p.name
    )


def _held(s3: S3Location, name: str, copies: _Copies) -> Callable[[RequestHead], bool]:
    """Requests for the copies' objects of export ``name``."""
    prefix = f"/{s3.url.rpartition('/')[2]}/{name}/"
    return lambda head: (
        head.method == "GET" and prefix in head.path and copies.downloaded(head.path)
    )


def _wait_for(check: Callable[[], bool], child: subprocess.Popen[str], limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert child.poll() is None, "the reader ended before it was stopped"
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_reader_killed_mid_download_leaves_nothing_in_the_cache_once_another_downloads(
    tmp_path: Path, s3: S3Location, copies: _Copies
) -> None:
    """SIGKILL while a reader downloads from object storage: its download is gone once
    the next reader downloads (here the same copy, which it then reads)."""
    _export(copies, s3.child("a"), s3.direct)
    cache = tmp_path / "cache"
    s3.proxy.delay_next(1000, 30, when=_held(s3, "a", copies))
    try:
        child = _reader(s3.child("a"), s3.counted, cache, copies)
        _wait_for(lambda: bool(_downloads(cache, copies)), child)
        child.send_signal(signal.SIGKILL)
        child.communicate()
    finally:
        s3.proxy.clear_faults()
    assert _downloads(cache, copies)  # what the kill left
    _read_all(_reader(s3.child("a"), s3.direct, cache, copies))
    assert _downloads(cache, copies) == []
    assert _temporary(cache) == []
    assert len(list((cache / copies.folder).iterdir())) == 1  # the finished copies' folder


def test_a_download_under_way_is_left_to_its_reader(
    tmp_path: Path, s3: S3Location, copies: _Copies
) -> None:
    """A reader that downloads while another's download is under way (that reader
    stopped, SIGSTOP, mid-download) removes nothing of it; both read their export."""
    for name in "ab":
        _export(copies, s3.child(name), s3.direct)
    cache = tmp_path / "cache"
    s3.proxy.delay_next(1, 3, when=_held(s3, "a", copies))
    slow = _reader(s3.child("a"), s3.counted, cache, copies)
    try:
        _wait_for(lambda: bool(_downloads(cache, copies)), slow)
        slow.send_signal(signal.SIGSTOP)
        under_way = _downloads(cache, copies)
        _read_all(_reader(s3.child("b"), s3.direct, cache, copies))
        assert _downloads(cache, copies) == under_way
        slow.send_signal(signal.SIGCONT)
        _read_all(slow)
    finally:
        s3.proxy.clear_faults()
        if slow.poll() is None:  # a failed check left it stopped
            slow.kill()
            slow.communicate()
    assert _downloads(cache, copies) == []
    assert _temporary(cache) == []
    assert len(list((cache / copies.folder).iterdir())) == 2


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
    tmp_path: Path, s3: S3Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporary files and folders of killed readers of earlier versions (no lock) are
    removed by the next download once nothing changed in them for LEGACY_AGE; the
    finished copies stay."""
    _export(_COPIES["index"], s3.url, s3.direct)
    cache = tmp_path / "cache"
    left = _earlier_leftovers(cache, age=LEGACY_AGE + 60)
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(cache))
    ds = shardex.open_dataset(s3.url, storage_options=s3.direct)
    assert sorted(s["__key__"] for s in ds) == _KEYS
    assert ds.get("k3")["__key__"] == "k3"  # downloads the key table
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
