"""Members of object-storage tars that a Ray scan task read, held in Ray's object store
for the shard tasks (``--executor ray``) so they are not fetched twice. Parts under
:data:`MIN_PART` are dropped (Ray would inline them into the driver); held tars take at
most :data:`HOLD_SHARE` of the object store; parts die with the driver.
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

#: A shard task brings whole parts to its node: about what a few shards read.
PART_BYTES: Final = 16 << 20
#: Ray inlines results under 100 KiB (``max_direct_call_object_size``) into the driver.
MIN_PART: Final = 256 << 10
#: Object store share for held tars (by listed size); the rest is the export's.
HOLD_SHARE: Final = 0.5

#: ``index`` rows (tar offset, size, place in ``data``) in tar order, and the bytes.
Part = tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]


@dataclass(frozen=True, slots=True)
class HeldTar:
    """One tar's parts: ``parts[i]`` (a ref) holds members within ``[starts[i], ends[i])``."""

    url: str
    parts: tuple[Any, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]


@dataclass(slots=True)
class _Gathering:
    index: list[tuple[int, int, int]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)

    def part(self) -> Part:
        return np.array(self.index, np.int64).reshape(-1, 3), np.frombuffer(self.data, np.uint8)


class TarHold:
    """What one tar's scan fetched (:meth:`put`), made into parts per sample (:meth:`take`)
    and handed over by :meth:`ready` and :meth:`finish`; :attr:`spans` are their ranges."""

    def __init__(self) -> None:
        self._starts: list[int] = []  # what was fetched and not taken yet, by tar offset
        self._data: list[bytes] = []
        self._filling = _Gathering()
        self._kept: _Gathering | None = None  # full, kept back: a small last part joins it
        self._ready: list[Part] = []
        self.spans: list[tuple[int, int]] = []

    def put(self, start: int, data: bytes) -> None:
        if data:
            i = bisect.bisect_right(self._starts, start)
            self._starts.insert(i, start)
            self._data.insert(i, data)

    def take(self, members: Iterable[tuple[str, int, int, str | None]]) -> None:
        """A finished sample's members (ext, offset, size, copy): those wholly fetched go
        into the part; fetched bytes before their end are dropped."""
        end = -1
        for _, offset, size, _ in members:
            end = offset + size
            if size > 0 and self._gather(offset, size) and len(self._filling.data) >= PART_BYTES:
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
        """No-op: :meth:`finish` hands the parts over."""

    def ready(self) -> list[Part]:
        """The parts made since the last call."""
        ready, self._ready = self._ready, []
        return ready

    def finish(self) -> list[Part]:
        """The last parts; one under :data:`MIN_PART` joins the one before, or is dropped."""
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
        self.warned = False  # a tar was left out for want of room (said once)

    def __bool__(self) -> bool:
        return bool(self._by_url)

    def add(self, url: str, parts: tuple[Any, ...], spans: list[tuple[int, int]]) -> None:
        """Add the parts a task kept of the tar at ``url``."""
        if not parts:
            return
        had = self._by_url.get(url)
        every = []
        if had is not None:
            every = list(zip(zip(had.starts, had.ends, strict=True), had.parts, strict=True))
        every += zip(spans, parts, strict=True)
        every.sort(key=lambda kept: kept[0])
        self._by_url[url] = HeldTar(
            url,
            tuple(part for _, part in every),
            tuple(start for (start, _), _ in every),
            tuple(end for (_, end), _ in every),
        )

    def named(self, paths: Iterable[str | None]) -> tuple[HeldTar, ...]:
        """The held tars among ``paths``."""
        return tuple(self._by_url[p] for p in paths if p is not None and p in self._by_url)


_HELD: contextvars.ContextVar[HeldTars | None] = contextvars.ContextVar(
    "shardex_held_tars", default=None
)


@contextlib.contextmanager
def tars_held() -> Iterator[HeldTars]:
    """Tar scans by Ray in this context hold what they read until it ends."""
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
    """Members read from held tars' parts in a shard task (each part fetched once)."""

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
            except ray.exceptions.ObjectLostError:  # node lost: fetch from the store
                got = _NO_PART
            self._parts[(tar.url, i)] = got
        return got


_NO_PART: Final[Part] = (np.zeros((0, 3), np.int64), np.zeros(0, np.uint8))
