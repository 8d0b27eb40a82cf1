"""Caller buffers that members reference where they are: an in-memory source's byte strings
are written from the caller's own objects, never copied into Arrow first.

A pinned member's ``path`` names its :class:`Pinned` list (a name no file can have: it holds
a NUL) and its ``offset`` is its index there. Only the process holding the list can read it,
so rows with pinned members are written in that process (they count as in memory).
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Final

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
