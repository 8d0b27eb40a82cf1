"""What the test servers share: started by ``with`` and stopped when the block ends."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Service:
    """A context manager of :meth:`start` (on entry) and :meth:`stop` (on exit), which a
    subclass gives; both may also be called directly."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
