"""Local copies of objects, for readers that need a file (a memory-mapped index, DALI's
index files, a metadata table read in pieces).

A reader downloads into a folder of its own (``index/download-{pid}-...``), locked while
it writes (:func:`shardex.storage.scratch.locked_folder`), then renames the file into
place: a reader never sees a partial copy. One killed mid-download leaves its folder, and
the next reader to download removes it (its lock is free); a live reader's folder is
never removed. Readers before these locks left ``.NAME.tmp-PID`` files beside the copies
and ``.{digest}.tmp-*`` folders in ``tensordict/``, without a lock: the next download
removes those untouched for :data:`LEGACY_AGE` seconds (a live download writes into its
file continually).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Final

from shardex.storage.base import Storage

#: The folders that readers download into, beside the finished copies (the tensordict
#: backend uses the same name under ``tensordict/``).
DOWNLOAD: Final = "download-"

#: Seconds after which an unlocked temporary file or folder of an earlier reader counts
#: as left by a killed one: no lock says whether its process lives.
LEGACY_AGE: Final = 3600.0

#: Earlier readers' temporary names: ``.NAME.tmp-PID`` files under ``index/`` and
#: ``.{16 hex digits}.tmp-RANDOM`` folders under ``tensordict/``.
_LEGACY_FILE: Final = re.compile(r"\..+\.tmp-[0-9]+")
_LEGACY_FOLDER: Final = re.compile(r"\.[0-9a-f]{16}\.tmp-.+")

#: The cache folders whose earlier readers' leftovers this process has removed already.
_SWEPT: set[Path] = set()


def cache_dir() -> Path:
    """Where shardex keeps generated and downloaded files (``$SHARDEX_CACHE_DIR``)."""
    return Path(os.environ.get("SHARDEX_CACHE_DIR", Path.home() / ".cache" / "shardex"))


def local_copy(storage: Storage, path: str, fingerprint: str) -> Path:
    """A local file for an object: itself when local, else a download cached under
    ``fingerprint`` (e.g. the checksums of the files it belongs with), so that a replaced
    export never meets a stale copy."""
    local = storage.local_path(path)
    if local is not None:
        return local
    target = cached_path(storage, path, fingerprint)
    if not target.is_file():
        root = cache_dir() / "index"
        _download(storage, path, target, root, target.relative_to(root).parts[0])
    return target


def cached_path(storage: Storage, path: str, fingerprint: str) -> Path:
    """Where the cache keeps its copy of ``storage``'s object ``path`` (``fingerprint``:
    see :func:`local_copy`)."""
    import hashlib  # here: ~3 ms to import, and only a remote object needs a local copy

    digest = hashlib.sha256(f"{storage.uri}\0{fingerprint}".encode()).hexdigest()[:16]
    return cache_dir() / "index" / digest / path


def _download(storage: Storage, path: str, target: Path, root: Path, digest: str) -> None:
    from shardex.storage.scratch import locked_folder, remove_stale  # only on a download

    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(root, DOWNLOAD)
    remove_legacy_leftovers()
    tmp, lock = locked_folder(root, DOWNLOAD, digest)
    try:
        part = tmp / "part"
        part.write_bytes(storage.get(path))
        os.replace(part, target)
    finally:
        import shutil  # here: shutil imports bz2 and lzma, and opening needs none

        shutil.rmtree(tmp, ignore_errors=True)
        os.close(lock)


def remove_legacy_leftovers(root: Path | None = None, now: float | None = None) -> None:
    """Remove what readers before the download locks left in the cache ``root`` (by
    default :func:`cache_dir`) when killed: their temporary files and folders untouched
    for :data:`LEGACY_AGE` seconds. Once per process and cache."""
    root = root or cache_dir()
    if root in _SWEPT:
        return
    _SWEPT.add(root)
    before = (time.time() if now is None else now) - LEGACY_AGE
    for folder, dirs, files in os.walk(root / "index"):
        for name in files:
            if _LEGACY_FILE.fullmatch(name):
                _remove_if_older(Path(folder, name), before)
        dirs[:] = [d for d in dirs if not d.startswith(DOWNLOAD)]  # locked: not legacy
    try:
        entries = list((root / "tensordict").iterdir())
    except OSError:
        return
    for entry in entries:
        if _LEGACY_FOLDER.fullmatch(entry.name):
            _remove_if_older(entry, before)


def _newest(path: Path) -> float:
    """The last time anything in ``path`` (a file, or a folder and what it holds) changed."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for folder, _, files in os.walk(path):
            for name in files:
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
            newest = max(newest, os.lstat(folder).st_mtime)
    return newest


def _remove_if_older(path: Path, before: float) -> None:
    try:
        if _newest(path) >= before:
            return  # maybe an earlier reader's download under way
        if path.is_dir() and not path.is_symlink():
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass  # gone already (another reader's sweep), or not ours to remove
