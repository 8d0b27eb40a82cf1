"""A bounded shuffle buffer that can be replayed on positions alone: choice ``step`` is a
hash of ``(key, step)``, so a resume reads only the samples held and those not reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Generic, TypeVar

from shardex.torch.order import Segment, cut, merge, plan_length, positions
from shardex.torch.permutation import mix64

T = TypeVar("T")
_GOLDEN: Final = 0x9E3779B97F4A7C15


def draw(key: int, step: int, bound: int) -> int:
    """A uniform integer in ``range(bound)``, a pure function of ``(key, step)``."""
    return (mix64(key ^ mix64(step + _GOLDEN)) * bound) >> 64


class ShuffleBuffer(Generic[T]):
    """Holds up to ``size`` items; once full, each new item takes the place of a random
    held one, given out (``size <= 1``: input order). ``items``, ``step``: a replayed state."""

    def __init__(self, size: int, key: int, *, items: list[T] | None = None, step: int = 0):
        self.size, self.key = size, key
        self.items: list[T] = items if items is not None else []
        self.step = step

    def push(self, item: T) -> T | None:
        """Take an item in; returns the item given out, or None while filling."""
        if self.size <= 1:
            self.step += 1
            return item
        if len(self.items) < self.size:
            self.items.append(item)
            return None
        j = draw(self.key, self.step, self.size)
        out, self.items[j] = self.items[j], item
        self.step += 1
        return out

    def pop(self) -> T:
        """Give out a random held item (once the input has ended)."""
        items = self.items
        j = draw(self.key, self.step, len(items))
        out = items[j]
        items[j] = items[-1]
        items.pop()
        self.step += 1
        return out


def replay(piece: Sequence[Segment], size: int, key: int, given: int) -> tuple[list[int], int]:
    """The positions a buffer over ``piece`` holds after giving out ``given`` items, and the
    number of positions of ``piece`` it has taken in by then."""
    if size <= 1:
        return [], given
    buffer = ShuffleBuffer[int](size, key)
    taken = 0
    for p in positions(piece):
        if buffer.step == given:
            break
        buffer.push(p)
        taken += 1
    while buffer.step < given:
        buffer.pop()
    return buffer.items, taken


def leftovers(piece: Sequence[Segment], size: int, key: int, given: int) -> list[Segment]:
    """The positions of ``piece`` a buffer has not given out after ``given`` items: the held
    ones, then those not taken in yet."""
    held, taken = replay(piece, size, key, given)
    rest = cut(piece, taken, plan_length(piece))
    return merge([(p, p + 1) for p in held] + rest)
