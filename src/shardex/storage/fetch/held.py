"""Members of tars on object storage that a Ray task's scan read, held in Ray's object
store for the tasks that write their shards (``--executor ray``).

A scan reads small members through (see :mod:`shardex.storage.fetch.tars`); writing
their shards would fetch them again. A local export keeps a copy on its scratch disk;
with Ray, the scan runs in a task on any node and the shards are written by other tasks
on any node, so the scan task keeps them in Ray's object store instead: as it reads,
:class:`TarHold` gathers the bytes of every member it read whole (no headers, no
``.cls`` or ``.json``: the scan table holds those) into parts of about
:data:`PART_BYTES`, which the task yields one by one (a streaming generator task: Ray
stores each part on the task's node, owned by the driver, and spills it to that node's
disk when memory runs short). The task never holds a whole tar: a part, the one before
(kept back so that a small last part joins it) and the scan's window.

The driver keeps only the parts' object refs and the tar ranges they cover
(:class:`HeldTar`, registered in the :func:`tars_held` context of the export), next to
the reference rows: each record batch of rows that pass 1 puts in the object store
names the held tars its members come from, and a shard task gets the refs of those
(:class:`shardex.refs.rows.SpillSlice`). The task reads a member from its part
(:class:`HeldReads`: Ray brings the part to the task's node, never through the driver)
when the part holds it, else fetches it from the store as before. Rows still name the
tar's URL: what is written is the same with or without the parts.

Bounds: a part is at least :data:`MIN_PART` (Ray hands a task's smaller results to the
caller inline: into the driver's memory), so a tar with less read through than that is
not held; the tars held are at most :data:`HOLD_SHARE` of the cluster's object store
memory (their listed sizes, in order); the others are fetched again, after one
:class:`~shardex.errors.RefetchWarning`. Parts live until the export ends (its driver
drops the refs), or with the driver: a killed export's parts go with it, and its resume
scans again.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

#: Bytes of members gathered into one part (one object in Ray's object store): a shard
#: task brings whole parts to its node, so a part is about what a few shards read.
PART_BYTES: Final = 16 << 20
#: The smallest part kept: Ray hands task results under 100 KiB (its default
#: ``max_direct_call_object_size``) to the caller inline, into the driver's memory.
MIN_PART: Final = 256 << 10
#: The share of the cluster's object store memory that held tars may take (by their
#: listed sizes): the rest is for the reference rows and the export's other objects.
HOLD_SHARE: Final = 0.5

#: A part: ``index`` rows (tar offset, size, place in ``data``) of its members, in tar
#: order, and ``data``, their bytes one after another.
Part = tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]


@dataclass(frozen=True, slots=True)
class HeldTar:
    """The parts of one tar in Ray's object store: ``parts[i]`` (an object ref) holds
    whole members lying in tar bytes ``[starts[i], ends[i])``."""

    url: str
    parts: tuple[Any, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]


@dataclass(slots=True)
class _Gathering:
    """A part being filled."""

    index: list[tuple[int, int, int]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)

    def part(self) -> Part:
        return np.array(self.index, np.int64).reshape(-1, 3), np.frombuffer(self.data, np.uint8)


class TarHold:
    """What one tar's scan fetched (:meth:`put`, by :class:`~shardex.storage.fetch.tars.RangedTar`),
    made into parts: after each sample (:meth:`take`), the bytes of its members read
    whole go into the part being filled; :meth:`ready` and :meth:`finish` hand the parts
    over, and :attr:`spans` says which tar bytes each covers."""

    def __init__(self) -> None:
        self._starts: list[int] = []  # what was fetched and not taken yet, by tar offset
        self._data: list[bytes] = []
        self._filling = _Gathering()
        self._kept: _Gathering | None = None  # full, kept back: a small last part joins it
        self._ready: list[Part] = []
        #: The tar range of each part handed over, in order.
        self.spans: list[tuple[int, int]] = []

    def put(self, start: int, data: bytes) -> None:
        """Bytes ``start`` on of the tar, as fetched."""
        if data:
            i = bisect.bisect_right(self._starts, start)
            self._starts.insert(i, start)
            self._data.insert(i, data)

    def take(self, members: Iterable[tuple[str, int, int, str | None]]) -> None:
        """The members of a sample the scan is past (ext, offset, size, copy): those
        whose bytes were all fetched go into the part; what was fetched before their
        end is dropped (the scan never asks back past a sample it handed over)."""
        end = -1
        for _, offset, size, _ in members:
            end = offset + size
            gathered = size > 0 and self._gather(offset, size)
            if gathered and len(self._filling.data) >= PART_BYTES:
                self._seal()
        if end >= 0:
            self._forget(end)

    def _gather(self, offset: int, size: int) -> bool:
        """Member bytes ``[offset, offset + size)`` into the part, if all were fetched."""
        pieces: list[memoryview] = []
        at, end = offset, offset + size
        for start, data in zip(self._starts, self._data, strict=True):
            if start > at:
                break
            if at < start + len(data):
                stop = min(end, start + len(data))
                pieces.append(memoryview(data)[at - start : stop - start])
                at = stop
                if at == end:
                    out = self._filling
                    out.index.append((offset, size, len(out.data)))
                    for piece in pieces:
                        out.data += piece
                    return True
        return False

    def _forget(self, before: int) -> None:
        # the first few only: fetches mostly follow each other (a hop back is rare, and
        # what it fetched goes once the scan is past it)
        while self._starts and self._starts[0] + len(self._data[0]) <= before:
            del self._starts[0], self._data[0]

    def _seal(self) -> None:
        if self._kept is not None:
            self._hand(self._kept)
        self._kept, self._filling = self._filling, _Gathering()

    def _hand(self, gathered: _Gathering) -> None:
        index, data = gathered.part()
        self._ready.append((index, data))
        self.spans.append((int(index[0, 0]), int(index[-1, 0] + index[-1, 1])))

    def close(self) -> None:
        """The scan is over (its parts are handed over by :meth:`finish`)."""

    def ready(self) -> list[Part]:
        """The parts made since the last call."""
        ready, self._ready = self._ready, []
        return ready

    def finish(self) -> list[Part]:
        """The last parts (the tar's scan is over): one under :data:`MIN_PART` joins
        the part before it, or is dropped (its members are fetched again)."""
        tail, kept = self._filling, self._kept
        self._filling, self._kept = _Gathering(), None
        if kept is not None and tail.index and len(tail.data) < MIN_PART:
            base = len(kept.data)
            kept.index += [(o, s, p + base) for o, s, p in tail.index]
            kept.data += tail.data
            tail = _Gathering()
        for gathered in (kept, tail):
            if gathered is not None and len(gathered.data) >= MIN_PART:
                self._hand(gathered)
        self._starts, self._data = [], []
        return self.ready()


class HeldTars:
    """The held tars of an export, by URL (the driver's; see :func:`tars_held`)."""

    def __init__(self) -> None:
        self._by_url: dict[str, HeldTar] = {}
        #: Whether a tar was left out for want of room (said once per export).
        self.warned = False

    def __bool__(self) -> bool:
        return bool(self._by_url)

    def add(self, url: str, parts: tuple[Any, ...], spans: list[tuple[int, int]]) -> None:
        """The parts a task kept of the tar at ``url`` (with those kept of it before)."""
        if not parts:
            return
        had = self._by_url.get(url)
        every = sorted(
            zip(spans, parts, strict=True)
            if had is None
            else [
                *zip(zip(had.starts, had.ends, strict=True), had.parts, strict=True),
                *zip(spans, parts, strict=True),
            ],
            key=lambda kept: kept[0],
        )
        self._by_url[url] = HeldTar(
            url,
            tuple(part for _, part in every),
            tuple(start for (start, _), _ in every),
            tuple(end for (_, end), _ in every),
        )

    def named(self, paths: Iterable[str | None]) -> tuple[HeldTar, ...]:
        """The held tars among ``paths`` (the distinct member paths of some rows)."""
        if not self._by_url:
            return ()
        return tuple(self._by_url[p] for p in paths if p is not None and p in self._by_url)


_HELD: contextvars.ContextVar[HeldTars | None] = contextvars.ContextVar(
    "shardex_held_tars", default=None
)


@contextlib.contextmanager
def tars_held() -> Iterator[HeldTars]:
    """Tar sources scanned in this context by a runner that keeps objects (Ray) hold
    what their scans read (see the module docstring) until the context ends: around
    an export's scan and the writing of its shards."""
    held = HeldTars()
    token = _HELD.set(held)
    try:
        yield held
    finally:
        _HELD.reset(token)


def held_tars() -> HeldTars | None:
    """The held tars of the :func:`tars_held` context this is in, if any."""
    return _HELD.get()


class HeldReads:
    """Members read from held tars' parts, in a shard task (parts fetched from Ray's
    object store when first needed, then kept for the task's job)."""

    def __init__(self, held: Iterable[HeldTar]) -> None:
        self._tars = {tar.url: tar for tar in held}
        self._parts: dict[tuple[str, int], Part] = {}

    def __bool__(self) -> bool:
        return bool(self._tars)

    def read(self, url: str, offset: int, size: int) -> memoryview | None:
        """The member's bytes (a view of its part), or None when no part holds them."""
        tar = self._tars.get(url)
        if tar is None:
            return None
        i = bisect.bisect_right(tar.starts, offset) - 1
        if i < 0 or offset + size > tar.ends[i]:
            return None
        index, data = self._part(tar, i)
        j = int(np.searchsorted(index[:, 0], offset))
        if j == len(index) or index[j, 0] != offset or index[j, 1] != size:
            return None
        at = int(index[j, 2])
        return data.data[at : at + size]

    def _part(self, tar: HeldTar, i: int) -> Part:
        got = self._parts.get((tar.url, i))
        if got is None:
            import ray  # only a Ray task gets held tars

            try:
                got = ray.get(tar.parts[i])
            except ray.exceptions.ObjectLostError:  # its node lost, and Ray could not make
                got = _NO_PART  # it again: its members are fetched from the store
            self._parts[(tar.url, i)] = got
        return got


_NO_PART: Final[Part] = (np.zeros((0, 3), np.int64), np.zeros(0, np.uint8))
