"""Caller buffers that members reference where they are: an in-memory source's byte strings
are written from the caller's own objects, never copied into Arrow first.

A pinned member's ``path`` names its :class:`Pinned` list (a name no file can have: it holds
a NUL) and its ``offset`` is its index there. Only the process holding the list can read it,
so rows with pinned members are written in that process (they count as in memory).
"""

from __future__ import annotations

import bisect
import itertools
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.errors import BadSampleError

PREFIX: Final = "\0pinned:"
_live: weakref.WeakValueDictionary[str, Pinned] = weakref.WeakValueDictionary()
_numbers = itertools.count()

Buffer = bytes | bytearray | memoryview


class Pinned:
    """A list of byte strings members point into (alive while this object is)."""

    def __init__(self, values: Sequence[Buffer]) -> None:
        self.values = values
        self.name = f"{PREFIX}{os.getpid()}.{next(_numbers)}"
        _live[self.name] = self

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("pinned bytes stay in the process that holds them")


class ArrowBytes(Sequence[memoryview]):
    """The values of a binary Arrow column, by number, as views of its buffers (no copy)."""

    def __init__(self, data: pa.ChunkedArray) -> None:
        self._chunks = [binary_views(chunk) for chunk in data.chunks]
        self._starts = np.cumsum([0, *(len(c) for c in data.chunks)]).tolist()
        self._one = len(self._chunks) == 1

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, j: int) -> memoryview:  # type: ignore[override]
        c = 0 if self._one else bisect.bisect_right(self._starts, j) - 1
        view, offsets = self._chunks[c]
        k = j - self._starts[c]
        return view[offsets[k] : offsets[k + 1]]


def binary_views(chunk: pa.Array) -> tuple[memoryview, npt.NDArray[np.int64]]:
    """A (large) binary array's bytes as one view, and each value's offsets in it."""
    buffers = chunk.buffers()
    width = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
    offsets = np.frombuffer(buffers[1], width)[chunk.offset : chunk.offset + len(chunk) + 1]
    # Arrow's buffers are signed chars to memoryview: unsigned, they compare as bytes
    values = buffers[2] if buffers[2] is not None else b""
    return memoryview(values).cast("B"), offsets.astype(np.int64, copy=False)


def buffers(values: Sequence[object]) -> list[Buffer]:
    """``values`` as buffers of bytes: bytes and bytearrays as they are, other buffers
    as flat byte views (a copy only of one that is not contiguous)."""
    out: list[Buffer] = []
    for v in values:
        if type(v) is bytes or type(v) is bytearray:
            out.append(v)
        else:
            view = memoryview(v)  # type: ignore[arg-type]  # the probe admits buffers only
            out.append(view.cast("B") if view.c_contiguous else view.tobytes())
    return out


def is_pinned(path: str) -> bool:
    return path.startswith(PREFIX)


def pinned_views(path: str, index: list[int]) -> list[memoryview]:
    """Views of members ``index`` of the pinned list ``path`` (the caller's own bytes)."""
    entry = _live.get(path)
    if entry is None:
        raise BadSampleError(
            "in-memory bytes are readable only in the process that holds them",
            reason="in-memory bytes gone",
        )
    view: Callable[[Buffer], memoryview] = memoryview
    return list(map(view, map(entry.values.__getitem__, index)))


def pinned_view(path: str, index: int, size: int) -> memoryview:
    """Member bytes ``index`` of the pinned list ``path``; BadSampleError if its size changed."""
    view = pinned_views(path, [index])[0]
    if view.nbytes != size:
        reason = f"changed size while exported ({size} bytes when listed, {view.nbytes} now)"
        raise BadSampleError(reason, reason=reason)
    return view
