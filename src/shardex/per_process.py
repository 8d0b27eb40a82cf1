"""One object per process: a forked child inherits objects but not their threads, so a
lock or pool taken in the parent is made again in the child."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """Calling it returns this process's ``make()``, made on the first call in each process."""

    __slots__ = ("_make", "_pid", "_value")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._pid = -1

    def __call__(self) -> T:
        pid = os.getpid()
        if self._value is None or self._pid != pid:
            self._value, self._pid = self._make(), pid
        return self._value
