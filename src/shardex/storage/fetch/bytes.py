"""Reading sample members' bytes once each: local files, objects (fetched ahead), held
tars and inline bytes (:class:`ByteSource` over Members; :class:`MemberReader` over rows)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Final

import numpy as np
import numpy.typing as npt

from shardex.errors import BadSampleError
from shardex.quoting import quoted
from shardex.refs.members import Members
from shardex.refs.pinned import ArrowBytes, is_pinned, pinned_view
from shardex.refs.scan import MemberRow
from shardex.storage.fetch.held import HeldReads
from shardex.storage.fetch.objects import ObjectReads, registered, sized

_OPEN_FILES: Final = 64


class _Arena:
    """Slices of a few large buffers, each reused once no view of it is left: a fresh
    ``bytes`` per 16 KB file took 22 µs (page faults), reused memory 11-14 µs."""

    def __init__(self) -> None:
        self._buffers: list[bytearray] = []
        self._view: memoryview | None = None
        self._at = 0

    def take(self, size: int) -> memoryview | None:
        """``size`` writable bytes no view returned before overlaps (None: too large)."""
        if size > _ARENA_BYTES // 4:
            return None
        if self._view is None or self._at + size > len(self._view):
            self._next()
        assert self._view is not None
        at, self._at = self._at, self._at + size
        return self._view[at : at + size]

    def _next(self) -> None:
        if self._view is not None:
            self._view.release()  # its slices still hold the buffer while they live
        for buffer in self._buffers:
            try:  # a buffer with views cannot change size: the test that none is left
                buffer.append(0)
            except BufferError:
                continue
            del buffer[-1]
            break
        else:
            buffer = bytearray(_ARENA_BYTES)
            self._buffers.append(buffer)
        self._view, self._at = memoryview(buffer), 0


#: A shard writer holds about two while it gathers 4 MiB, and up to five more while its
#: queued writes (8 of 4 MiB) wait for the disk.
_ARENA_BYTES: Final = 8 << 20


class _Files:
    """Byte ranges of local files, recent ones kept open; ``reuse``: into an :class:`_Arena`."""

    def __init__(self, reuse: bool = False) -> None:
        self._fds: dict[str, int] = {}
        self._arena = _Arena() if reuse else None

    def read(self, path: str, offset: int, size: int) -> bytes | memoryview:
        """``size`` bytes at ``offset`` of ``path`` (``offset`` -1: the whole file), into
        reused memory if asked; a BadSampleError if it cannot be read or its size changed."""
        into = None
        if self._arena is not None:  # a whole file: one byte more shows if it grew
            into = self._arena.take(size + 1 if offset < 0 else size)
        return self.get(path, offset, size, into)

    def get(self, path: str, offset: int, size: int, into: memoryview | None) -> bytes | memoryview:
        """:meth:`read`, into ``into`` if given (one byte more for a whole file)."""
        try:
            if offset < 0:  # a whole file: one read of one byte more shows if it grew
                whole = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    data = _read(whole, size + 1, into)
                finally:
                    os.close(whole)
            else:
                fd = self._fds.get(path)
                if fd is None:
                    if len(self._fds) > _OPEN_FILES:
                        self.close()
                    fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                data = _pread(fd, size, offset, into)
        except OSError as exc:
            raise BadSampleError(
                f"cannot read {quoted(path)}: {exc.strerror}",
                path=path,
                reason=f"cannot read {quoted(path)}: {exc.strerror or exc}",
            ) from exc
        if len(data) != size:  # the file changed since it was listed: refused there
            sized(bytes(data), size, path)
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def _read(fd: int, size: int, into: memoryview | None) -> bytes | memoryview:
    if into is None:
        return os.read(fd, size)
    return into[: os.readv(fd, [into])]


def _pread(fd: int, size: int, offset: int, into: memoryview | None) -> bytes | memoryview:
    if into is None or not hasattr(os, "preadv"):
        return os.pread(fd, size, offset)
    return into[: os.preadv(fd, [into], offset)]


class ByteSource:
    """Reads members' bytes: inline ones as views of their Arrow buffer, files with
    ``pread``, objects with a GET each (fetched ahead once :meth:`expect` names them)."""

    def __init__(self, members: Members) -> None:
        self._m = self.members = members
        self._inline = ArrowBytes(members.data)
        self._files = _Files(reuse=True)
        self._objects = ObjectReads(members.stores)
        self._held = HeldReads(members.held)
        self._is_url: npt.NDArray[np.bool_] | None = None  # per path name, when first needed
        self._read_ahead: dict[int, memoryview] = {}

    def _url(self, j: int) -> bool:
        if self._is_url is None:
            names = self._m.path_names
            self._is_url = np.fromiter(("://" in n for n in names), bool, len(names))
        code = self._m.path_codes[j]
        return bool(code >= 0 and self._is_url[code])

    def _held_bytes(self, j: int, url: str) -> memoryview | None:
        return self._held.read(url, int(self._m.offset[j]), int(self._m.size[j]))

    def expect(self, js: Iterable[int]) -> None:
        """The members that will be read, in order: objects among them are fetched ahead."""
        self._objects.expect(self._fetched(js))

    def _fetched(self, js: Iterable[int]) -> Iterator[tuple[int, str, int, int]]:
        """(number, URL, offset, size) of the members in ``js`` to fetch: not inline, not held."""
        m = self._m
        for j in js:
            if m.inline[j] or not self._url(j):
                continue
            url = m.path_names[m.path_codes[j]]
            if self._held_bytes(j, url) is None:
                yield j, url, int(m.offset[j]), int(m.size[j])

    def read(self, j: int) -> memoryview | bytes:
        """Member ``j``'s bytes (a view for inline members: no copy)."""
        if self._read_ahead:
            ahead = self._read_ahead.pop(j, None)
            if ahead is not None:
                return ahead
        m = self._m
        if m.inline[j]:
            return self._inline[j]
        path = m.path(j)
        if path is None:
            raise BadSampleError(f"member {j} has neither bytes nor a file", reason="no data")
        if is_pinned(path):
            return pinned_view(path, int(m.offset[j]), int(m.size[j]))
        if self._url(j):
            held = self._held_bytes(j, path)
            if held is not None:
                return held
            return self._objects.read(j, path, int(m.offset[j]), int(m.size[j]))
        return self._files.read(path, int(m.offset[j]), int(m.size[j]))

    def read_files(
        self, js: npt.NDArray[np.int64], limit: int
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], list[memoryview]] | None:
        """Members ``js``, all whole local files, read back to back into one buffer: its
        bytes, each member's start and view (kept for :meth:`read`, so no file is read
        twice). None when one is not a whole local file, they pass ``limit`` bytes, or
        one cannot be read as listed (the caller then reads them one by one)."""
        m = self._m
        codes = m.path_codes[js]
        if m.inline[js].any() or (codes < 0).any() or (m.offset[js] >= 0).any():
            return None
        if any("://" in m.path_names[c] for c in np.unique(codes).tolist()):
            return None  # objects: fetched as they are read
        sizes = m.size[js]
        if (sizes < 0).any() or int(sizes.sum()) > limit:
            return None
        starts = np.zeros(len(js), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        buffer = bytearray(int(sizes.sum()) + 1)
        view = memoryview(buffer)
        names, at, ends = m.path_names, starts.tolist(), (starts + sizes).tolist()
        try:
            for code, lo, hi in zip(codes.tolist(), at, ends, strict=True):
                # a byte more shows if the file grew
                self._files.get(names[code], -1, hi - lo, view[lo : hi + 1])
        except BadSampleError:
            return None
        views = list(map(view.__getitem__, map(slice, at, ends)))
        self._read_ahead = dict(zip(js.tolist(), views, strict=True))
        return np.frombuffer(buffer, np.uint8), starts, views

    def close(self) -> None:
        self._read_ahead = {}
        self._files.close()
        self._objects.close()


class MemberReader:
    """Reads the bytes of a scan table's member rows: files kept open, objects a GET each."""

    def __init__(self) -> None:
        self._files = _Files()
        # a worker has no stores of its own: those registered where the job was made
        self._objects = ObjectReads(registered())

    def read(self, member: MemberRow) -> bytes:
        data = member["data"]
        if data is not None:
            return data
        path = member["path"]
        assert path is not None  # a member without bytes names where they are
        if "://" in path:
            return self._objects.read(-1, path, member["offset"], member["size"])
        return bytes(self._files.read(path, member["offset"], member["size"]))  # no arena: bytes

    def close(self) -> None:
        self._files.close()
        self._objects.close()
