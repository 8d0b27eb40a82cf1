"""A seeded bijective permutation of ``range(n)`` in O(1) memory and O(1) time per index.

A balanced Feistel network over the smallest even bit width covering ``n``, with cycle
walking into ``range(n)`` (expected walks < 4); round keys come from ``(seed, epoch)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from shardex.errors import ConfigError

#: Feistel rounds; 6 already pass the avalanche tests, 8 leave a margin for tiny domains.
ROUNDS: Final = 8
_M64: Final = (1 << 64) - 1
_GOLDEN: Final = 0x9E3779B97F4A7C15
_C1: Final = 0xBF58476D1CE4E5B9
_C2: Final = 0x94D049BB133111EB
_CHUNK: Final = 1 << 16


def mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijective 64-bit mixer (Python integers)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * _C1) & _M64
    x = ((x ^ (x >> 27)) * _C2) & _M64
    return x ^ (x >> 31)


def mix64_array(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """:func:`mix64` over a uint64 array (arrays wrap around silently, scalars would warn)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_C1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_C2)
    return x ^ (x >> np.uint64(31))


def derive_key(*parts: int) -> int:
    """One 64-bit key from several integers (seed, epoch, rank, ...), order-sensitive."""
    key = 0x5EED
    for part in parts:
        key = mix64(key ^ mix64((part & _M64) + _GOLDEN))
    return key


@dataclass(frozen=True, slots=True)
class IndexPermutation:
    """The permutation of ``range(n)`` for one ``(seed, epoch)``: ``perm(i)`` is the index
    at position ``i``, ``perm.inverse(j)`` the position of ``j``; ``perm.map`` vectorises.
    ``n`` is at least 1; each epoch gets a new order."""

    n: int
    seed: int = 0
    epoch: int = 0
    _half: int = field(init=False, repr=False)
    _keys: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"a permutation needs n >= 1 indices, got n={self.n}")
        bits = max(2, (self.n - 1).bit_length())
        object.__setattr__(self, "_half", (bits + 1) // 2)
        base = derive_key(self.seed, self.epoch)
        object.__setattr__(self, "_keys", tuple(mix64(base + r * _GOLDEN) for r in range(ROUNDS)))

    def __len__(self) -> int:
        return self.n

    def _encrypt(self, x: int, inverse: bool) -> int:
        half = self._half
        mask = (1 << half) - 1
        left, right = x >> half, x & mask
        for key in reversed(self._keys) if inverse else self._keys:
            if inverse:
                left, right = right ^ (mix64(left + key) & mask), left
            else:
                left, right = right, left ^ (mix64(right + key) & mask)
        return (left << half) | right

    def __call__(self, i: int) -> int:
        """The index at position ``i`` of the shuffled order."""
        return self._walk(i, inverse=False)

    def inverse(self, j: int) -> int:
        """The position of index ``j`` in the shuffled order (``perm.inverse(perm(i)) == i``)."""
        return self._walk(j, inverse=True)

    def _walk(self, i: int, *, inverse: bool) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} is out of range for a permutation of {self.n}")
        y = self._encrypt(i, inverse)
        while y >= self.n:
            y = self._encrypt(y, inverse)
        return y

    def _encrypt_array(self, x: npt.NDArray[np.uint64], inverse: bool) -> npt.NDArray[np.uint64]:
        half = np.uint64(self._half)
        mask = np.uint64((1 << self._half) - 1)
        left, right = x >> half, x & mask
        for key in reversed(self._keys) if inverse else self._keys:
            k = np.uint64(key)
            if inverse:
                left, right = right ^ (mix64_array(left + k) & mask), left
            else:
                left, right = right, left ^ (mix64_array(right + k) & mask)
        return (left << half) | right

    def map(self, positions: npt.ArrayLike, *, inverse: bool = False) -> npt.NDArray[np.int64]:
        """:meth:`__call__` (or :meth:`inverse`) of every element of an integer array."""
        x = np.asarray(positions, dtype=np.int64)
        if x.size and (int(x.min()) < 0 or int(x.max()) >= self.n):
            raise IndexError(f"positions out of range for a permutation of {self.n}")
        y = self._encrypt_array(x.astype(np.uint64), inverse)
        n = np.uint64(self.n)
        todo = np.flatnonzero(y >= n)
        while todo.size:
            walked = self._encrypt_array(y[todo], inverse)
            y[todo] = walked
            todo = todo[walked >= n]
        return y.astype(np.int64)

    def __iter__(self) -> Iterator[int]:
        """Every index in shuffled order, evaluated a chunk at a time."""
        for start in range(0, self.n, _CHUNK):
            yield from self.map(np.arange(start, min(start + _CHUNK, self.n))).tolist()
