"""Reading the bytes of sample members, once each: local files (kept open, read into
reused memory), objects (ranged GETs, fetched ahead), tars a remote runner holds, and
inline bytes (:class:`ByteSource` over :class:`~shardex.refs.members.Members`;
:class:`MemberReader` over a scan table's rows)."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Iterator
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.errors import BadSampleError
from shardex.quoting import quoted
from shardex.refs.members import JSON_COLUMN, LABEL_FIELD, Members
from shardex.refs.scan import MEMBERS, MemberRow
from shardex.storage import Storage
from shardex.storage.fetch.held import HeldReads
from shardex.storage.fetch.objects import ObjectReads, registered, sized

#: Files a reader keeps open at most (a tar source reads many members of few files).
_OPEN_FILES: Final = 64


class _Arena:
    """Reused memory for the bytes read from files: slices of a few large buffers, each
    reused once no view of it is left (the shard writer drops its views when it writes
    them out). A fresh ``bytes`` per file costs the kernel's page faults on memory the
    allocator took back: measured 22 µs a 16 KB file read into new bytes, 11-14 µs into
    reused memory, 9-11 µs for the system calls alone (the 2-core VM, load 8)."""

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
        """A buffer no view holds any more, or a new one."""
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


#: Bytes of one arena buffer (a shard writer holds about two while it gathers 4 MiB).
_ARENA_BYTES: Final = 8 << 20


class _Files:
    """Byte ranges of local files, recently used files kept open. ``reuse``: the bytes
    come back as views of reused memory (see :class:`_Arena`), else as ``bytes``."""

    def __init__(self, reuse: bool = False) -> None:
        self._fds: dict[str, int] = {}
        self._arena = _Arena() if reuse else None

    def read(self, path: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of ``path`` (``offset`` -1: the whole file).

        Raises:
            BadSampleError: the file cannot be read, or its size changed.
        """
        data = self._get(path, offset, size, None)
        assert isinstance(data, bytes)  # read into no buffer
        return data

    def read_reused(self, path: str, offset: int, size: int) -> bytes | memoryview:
        """:meth:`read`, the bytes as a view of reused memory (see :class:`_Arena`)."""
        into = None
        if self._arena is not None:  # a whole file: one byte more shows if it grew
            into = self._arena.take(size + 1 if offset < 0 else size)
        return self._get(path, offset, size, into)

    def read_into(self, path: str, offset: int, size: int, into: memoryview) -> None:
        """:meth:`read` into ``into`` (``size`` bytes; one more for a whole file).

        Raises:
            BadSampleError: the file cannot be read, or its size changed.
        """
        self._get(path, offset, size, into)

    def _get(
        self, path: str, offset: int, size: int, into: memoryview | None
    ) -> bytes | memoryview:
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
    """Up to ``size`` bytes of ``fd`` (one read), into ``into`` when given."""
    if into is None:
        return os.read(fd, size)
    return into[: os.readv(fd, [into])]


def _pread(fd: int, size: int, offset: int, into: memoryview | None) -> bytes | memoryview:
    """Up to ``size`` bytes of ``fd`` at ``offset`` (one read), into ``into`` when given."""
    if into is None or not hasattr(os, "preadv"):
        return os.pread(fd, size, offset)
    return into[: os.preadv(fd, [into], offset)]


class ByteSource:
    """Reads members' bytes: inline ones as views of their Arrow buffer, file ones with
    ``pread`` (keeping recently used files open), objects with a GET each (fetched ahead,
    concurrently, once :meth:`expect` says which will be read)."""

    def __init__(self, members: Members) -> None:
        self._m = members
        #: Per chunk of ``members.data``: its value offsets and its bytes (a view).
        self._offsets: list[npt.NDArray[np.int64]] = []
        self._values: list[memoryview] = []
        ends = [0]
        for chunk in members.data.chunks:
            buffers = chunk.buffers()
            at = chunk.offset
            self._offsets.append(np.frombuffer(buffers[1], np.int64)[at : at + len(chunk) + 1])
            # Arrow's buffers are signed chars to memoryview: unsigned, they compare as bytes
            self._values.append(memoryview(buffers[2] if buffers[2] is not None else b"").cast("B"))
            ends.append(ends[-1] + len(chunk))
        #: Member numbers where each chunk starts (a chunk per source batch: few).
        self._chunk_starts = ends
        # the writer drops its views as it writes them out: file bytes go to reused memory
        self._files = _Files(reuse=True)
        self._objects = ObjectReads(members.stores)
        self._held = HeldReads(members.held)
        self._is_url: npt.NDArray[np.bool_] | None = None  # per path name, when first needed
        #: Members :meth:`read_files` read, by number: :meth:`read` takes them from there.
        self._read_ahead: dict[int, memoryview] = {}

    def _url(self, j: int) -> bool:
        """Whether member ``j`` (not inline) is an object named by URL."""
        if self._is_url is None:
            names = self._m.path_names
            self._is_url = np.fromiter(("://" in n for n in names), bool, len(names))
        code = self._m.path_codes[j]
        return bool(code >= 0 and self._is_url[code])

    def _held_bytes(self, j: int, url: str) -> memoryview | None:
        """Member ``j`` (of the object ``url``) as a Ray task's scan held it, if it did."""
        if not self._held:
            return None
        return self._held.read(url, int(self._m.offset[j]), int(self._m.size[j]))

    def expect(self, js: Iterable[int]) -> None:
        """The members that will be read, in that order: those on object storage are
        fetched ahead (call it only with members that will be read, or their bytes are
        fetched for nothing)."""
        self._objects.expect(self._fetched(js))

    def _fetched(self, js: Iterable[int]) -> Iterator[tuple[int, str, int, int]]:
        """Of members ``js``, those to fetch from object storage (number, URL, offset,
        size): not inline, and not held."""
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
            starts = self._chunk_starts
            c = 0 if len(starts) == 2 else bisect.bisect_right(starts, j) - 1
            k = j - starts[c]
            offsets = self._offsets[c]
            return self._values[c][offsets[k] : offsets[k + 1]]
        path = m.path(j)
        if path is None:
            raise BadSampleError(f"member {j} has neither bytes nor a file", reason="no data")
        if self._url(j):
            held = self._held_bytes(j, path)
            if held is not None:
                return held
            return self._objects.read(j, path, int(m.offset[j]), int(m.size[j]))
        return self._files.read_reused(path, int(m.offset[j]), int(m.size[j]))

    def read_files(
        self, js: npt.NDArray[np.int64], limit: int
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], list[memoryview]] | None:
        """Members ``js``, all whole local files (an image folder's), read back to back
        into one buffer: its bytes, where each member starts in it, and each member's view
        (:meth:`read` then gives them from there: a caller that falls back to reading them
        one by one reads no file twice). None when one is not a whole local file (a tar's
        members are read one by one into reused memory), they hold more than ``limit``
        bytes, or one cannot be read as listed (the caller then reads them one by one,
        which refuses or records that member)."""
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
                self._files.read_into(names[code], -1, hi - lo, view[lo : hi + 1])
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
    """Reads the bytes of members given as dicts (a scan table's rows), keeping recently
    used files open; objects with a GET each, from the stores registered in this
    process (see :mod:`shardex.storage.fetch.objects`)."""

    def __init__(self, stores: tuple[tuple[str, Storage], ...] | None = None) -> None:
        self._files = _Files()
        # stores: those registered where the job was made (a worker has none of its own)
        self._objects = ObjectReads(registered() if stores is None else stores)

    def read(self, member: MemberRow) -> bytes:
        data = member["data"]
        if data is not None:
            return data
        path = member["path"]
        assert path is not None  # a member without bytes names where they are
        if "://" in path:
            return self._objects.read(-1, path, member["offset"], member["size"])
        return self._files.read(path, member["offset"], member["size"])

    def close(self) -> None:
        self._files.close()
        self._objects.close()


def iter_fields(
    rows: pa.Table, with_label: bool, reader: MemberReader
) -> Iterator[list[tuple[str, bytes]]]:
    """Each row's fields in member order: source members, ``cls``, ``json``."""
    n = rows.num_rows
    members = rows.column(MEMBERS).to_pylist()
    labels = rows.column("label").to_pylist() if with_label else [None] * n
    has_json = JSON_COLUMN in rows.column_names
    jsons: list[bytes | None] = rows.column(JSON_COLUMN).to_pylist() if has_json else [None] * n
    for i in range(n):
        fields = [(m["ext"], reader.read(m)) for m in members[i]]
        if labels[i] is not None:
            fields.append((LABEL_FIELD, str(labels[i]).encode()))
        text = jsons[i]
        if text is not None:
            fields.append(("json", text))
        yield fields
