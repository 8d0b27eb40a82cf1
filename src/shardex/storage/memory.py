"""In-memory storage: ``memory://NAME/PREFIX``, objects held by this process.

For tests without a disk or server; it behaves as an object store. A pickled copy in
another process is read-only: its writes would be lost to the owner.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import xxhash

from shardex.errors import ConfigError, ObjectNotFoundError, StorageError
from shardex.storage.base import CountingWriter, Storage, checked_path

__all__ = ["SCHEME", "MemoryStorage"]

SCHEME: Final = "memory://"


@dataclass
class _Bucket:
    owner: int  # the pid that writes it
    objects: dict[str, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_buckets: dict[str, _Bucket] = {}


class MemoryStorage(Storage):
    """Objects under ``memory://NAME/PREFIX`` in this process's memory; ``storage_options``
    are ignored (a source may get its output's S3 options)."""

    page_size: int = 1000  # of list_pages, as S3's; tests make it smaller

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        name, _, prefix = url[len(SCHEME) :].rstrip("/").partition("/")
        if not url.startswith(SCHEME) or not name:
            raise ConfigError(f"{url!r} is not a {SCHEME}NAME[/PREFIX] URL")
        del storage_options
        self.uri = url.rstrip("/")
        self._name, self._prefix = name, f"{prefix}/" if prefix else ""
        self._bucket = _buckets.setdefault(name, _Bucket(os.getpid()))

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "owner": self._bucket.owner, "objects": self._mine()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["uri"])  # type: ignore[misc]
        if self._bucket.owner == os.getpid() and self._bucket.owner == state["owner"]:
            return  # the owner's own storage, pickled and back
        # another process's objects: this copy is refreshed by each storage that arrives
        with self._bucket.lock:
            self._bucket.owner = state["owner"]
            for key in [k for k in self._bucket.objects if k.startswith(self._prefix)]:
                del self._bucket.objects[key]
            self._bucket.objects.update(state["objects"])

    def __repr__(self) -> str:
        return f"MemoryStorage({self.uri!r})"

    def _key(self, path: str) -> str:
        return self._prefix + checked_path(path, self.uri)

    def _mine(self) -> dict[str, bytes]:
        # a copy: threads may write meanwhile
        with self._bucket.lock:
            return {k: v for k, v in self._bucket.objects.items() if k.startswith(self._prefix)}

    def _writable(self, path: str) -> str:
        key = self._key(path)
        if self._bucket.owner != os.getpid():
            raise StorageError(
                f"cannot write {self.join(path)}: {SCHEME} objects are written only by the "
                f"process that made them (pid {self._bucket.owner}); export with workers=1"
            )
        return key

    def clear(self) -> None:
        """Delete every object under the root."""
        for path in self.list():
            self.delete(path)

    def get(self, path: str) -> bytes:
        try:
            return self._bucket.objects[self._key(path)]
        except KeyError:
            raise ObjectNotFoundError(f"{self.join(path)} does not exist") from None

    def get_range(self, path: str, start: int, length: int) -> bytes:
        return self.get(path)[start : start + length]

    def size(self, path: str) -> int:
        return len(self.get(path))

    def exists(self, path: str) -> bool:
        return self._key(path) in self._bucket.objects

    def list(self, prefix: str = "") -> Iterator[str]:
        cut = len(self._prefix)
        return iter(sorted(k[cut:] for k in self._mine() if k[cut:].startswith(prefix)))

    def list_pages(
        self, folder: str = "", after: str | None = None
    ) -> Iterator[builtins.list[tuple[str, int]]]:
        names = [n for n in self.list(f"{folder}/" if folder else "") if after is None or n > after]
        for at in range(0, len(names), self.page_size):
            yield [(name, self.size(name)) for name in names[at : at + self.page_size]]

    def delete(self, path: str) -> None:
        self._bucket.objects.pop(self._writable(path), None)

    def rename(self, source: str, target: str) -> None:
        key, target_key = self._writable(source), self._writable(target)
        with self._bucket.lock:
            if key not in self._bucket.objects:
                raise ObjectNotFoundError(f"{self.join(source)} does not exist")
            self._bucket.objects[target_key] = self._bucket.objects.pop(key)

    def put(self, path: str, data: bytes | bytearray | memoryview) -> None:
        self._bucket.objects[self._writable(path)] = bytes(data)

    def open_writer(self, path: str) -> _MemoryWriter:
        self._writable(path)
        return _MemoryWriter(self, path)

    def get_tagged(self, path: str) -> tuple[bytes, str] | None:
        data = self._bucket.objects.get(self._key(path))
        return None if data is None else (data, xxhash.xxh3_64_hexdigest(data))

    def put_if(self, path: str, data: bytes, tag: str | None) -> str | None:
        """Atomic, as an object store's conditional put."""
        key = self._writable(path)
        with self._bucket.lock:
            found = self.get_tagged(path)
            if (None if found is None else found[1]) != tag:
                return None
            self._bucket.objects[key] = bytes(data)
        return xxhash.xxh3_64_hexdigest(data)


class _MemoryWriter(CountingWriter):
    """Parts held until :meth:`commit` puts them as one object."""

    def __init__(self, storage: MemoryStorage, path: str) -> None:
        super().__init__()
        self._storage, self._path = storage, path
        self._parts: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._parts.append(bytes(data))
        self._pos += len(data)

    def commit(self) -> None:
        if not self._done:
            self._done = True
            self._storage.put(self._path, b"".join(self._parts))

    def abort(self) -> None:
        self._done = True
        self._parts.clear()
