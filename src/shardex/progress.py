"""Progress reporting: rich bars for people, nothing for library calls that did not ask.

Off a terminal (a CI log) an export's bar adds one plain line every :data:`PLAIN_EVERY`
seconds, so a long export shows it is alive without flooding the log.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final, Protocol, Self

if TYPE_CHECKING:
    from rich.console import Console

_LOG_WIDTH: Final = 150

PLAIN_EVERY: Final = 60.0


class Task(Protocol):
    """One bar."""

    def advance(self, n: int = 1) -> None: ...

    def done(self) -> None: ...


class ExportTask(Task, Protocol):
    """A bar of samples that also counts the bytes and shards written."""

    def shard(self, num_samples: int, num_bytes: int) -> None:
        """One shard written."""


class _NoTask:
    def advance(self, n: int = 1) -> None:
        pass

    def shard(self, num_samples: int, num_bytes: int) -> None:
        pass

    def done(self) -> None:
        pass


def rate(value: float) -> str:
    """A rate with about three significant digits (``1234``, ``56.7``, ``8.90``)."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def rates(completed: float, num_bytes: int, shards: int, elapsed: float | None) -> str:
    """``samples/s, bytes/s, shards/s`` averaged over ``elapsed`` seconds."""
    from rich.filesize import decimal

    if not elapsed:
        return "- samples/s, - B/s, - shards/s"
    return (
        f"{rate(completed / elapsed)} samples/s, "
        f"{decimal(int(num_bytes / elapsed), precision=2)}/s, "
        f"{rate(shards / elapsed)} shards/s"
    )


def _rates_column() -> Any:
    from rich.progress import ProgressColumn
    from rich.table import Column
    from rich.text import Text

    class Rates(ProgressColumn):
        def render(self, task: Any) -> Text:
            if "bytes" not in task.fields:
                return Text("")
            line = rates(task.completed, task.fields["bytes"], task.fields["shards"], task.elapsed)
            return Text(line, style="progress.data.speed")

    return Rates(table_column=Column(no_wrap=True))  # on one line, even in 80 columns


class Progress:
    """A set of progress bars; silent unless ``enabled``."""

    def __init__(
        self,
        enabled: bool = False,
        *,
        console: Console | None = None,
        plain_every: float = PLAIN_EVERY,
    ) -> None:
        self._bars: Any = None
        self._plain_every = plain_every
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bars

            if console is None:
                from rich.console import Console

                console = Console()
                if not console.is_terminal:  # a log: a long line beats a wrapped one
                    console.width = max(console.width, _LOG_WIDTH)
            self._bars = Bars(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                _rates_column(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )

    def __enter__(self) -> Self:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            # rich's stop() only signals its daemon refresh thread; one still running at
            # exit is killed taking the GIL and the process aborts: join it.
            thread = getattr(self._bars.live, "_refresh_thread", None)
            self._bars.stop()
            if thread is not None:
                thread.join()

    def task(self, description: str, total: int | None) -> Task:
        if self._bars is None:
            return _NoTask()
        return _Bar(self._bars, self._bars.add_task(description, total=total), None)

    def export_task(self, description: str, total: int | None) -> ExportTask:
        """Start a bar of samples that also shows bytes and shards per second."""
        if self._bars is None:
            return _NoTask()
        task_id = self._bars.add_task(description, total=total, bytes=0, shards=0)
        plain = None if self._bars.console.is_terminal else self._plain_every
        return _Bar(self._bars, task_id, plain)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class _Bar:
    """One rich bar; ``plain``: seconds between plain lines (None: none, on a terminal)."""

    def __init__(self, bars: Any, task_id: Any, plain: float | None) -> None:
        self._bars, self._id, self._plain = bars, task_id, plain
        self._last = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self._bars.advance(self._id, n)

    def shard(self, num_samples: int, num_bytes: int) -> None:
        task = self._bars.tasks[self._id]
        fields = task.fields
        self._bars.update(
            self._id,
            advance=num_samples,
            bytes=fields["bytes"] + num_bytes,
            shards=fields["shards"] + 1,
        )
        if self._plain is not None and time.monotonic() - self._last >= self._plain:
            self._last = time.monotonic()
            self._bars.console.print(self._line(task), highlight=False)

    def _line(self, task: Any) -> str:
        total = f"/{task.total:,}" if task.total is not None else ""
        left = task.time_remaining
        eta = "" if left is None else f", eta {_clock(left)}"
        speeds = rates(task.completed, task.fields["bytes"], task.fields["shards"], task.elapsed)
        return f"{task.description}: {task.completed:,}{total} samples, {speeds}{eta}"

    def done(self) -> None:
        task = self._bars.tasks[self._id]
        self._bars.update(self._id, total=task.completed or 1, completed=task.completed or 1)
