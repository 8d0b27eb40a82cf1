"""Local copies of objects, for readers that need a file (a memory-mapped index, DALI's
index files, a metadata table read in pieces)."""

from __future__ import annotations

import os
from pathlib import Path

from shardex.storage.base import Storage


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
    import hashlib  # here: ~3 ms to import, and only a remote object needs a local copy

    digest = hashlib.sha256(f"{storage.uri}\0{fingerprint}".encode()).hexdigest()[:16]
    target = cache_dir() / "index" / digest / path
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_bytes(storage.get(path))
        os.replace(tmp, target)
    return target
