"""Progress reporting: rich bars for people, nothing for library calls that did not ask."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol, Self


class Task(Protocol):
    """One bar."""

    def advance(self, n: int = 1) -> None: ...

    def done(self) -> None: ...


class _NoTask:
    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        pass


class Progress:
    """A set of progress bars; silent unless ``enabled``."""

    def __init__(self, enabled: bool = False) -> None:
        self._bars: Any = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bars

            self._bars = Bars(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                transient=False,
            )

    def __enter__(self) -> Self:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bars is not None:
            # rich's stop() only signals its refresh thread (a daemon) to end. One still
            # running at interpreter exit is killed mid-call (pthread_exit while taking the
            # GIL) and the process aborts with "terminate called without an active
            # exception" after its work is done: join it here.
            thread = getattr(self._bars.live, "_refresh_thread", None)
            self._bars.stop()
            if thread is not None:
                thread.join()

    def task(self, description: str, total: int | None) -> Task:
        """Start a bar of ``total`` steps."""
        if self._bars is None:
            return _NoTask()
        bars = self._bars
        task_id = bars.add_task(description, total=total)

        class _Bar:
            def advance(self, n: int = 1) -> None:
                bars.advance(task_id, n)

            def done(self) -> None:
                task = bars.tasks[task_id]
                bars.update(task_id, total=task.completed or 1, completed=task.completed or 1)

        return _Bar()
