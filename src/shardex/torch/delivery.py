"""Which worker's samples a DataLoader has handed out: it hands worker batches out
round-robin, skipping exhausted workers, so the samples taken fix each worker's count.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardex.errors import ConfigError


def batch_sizes(remaining: int, batch_size: int, drop_last: bool) -> tuple[int, int]:
    """``(full batches, size of the short last batch or 0)`` of one worker."""
    full, short = divmod(remaining, batch_size)
    return full, 0 if drop_last else short


def deliverable(remaining: int, batch_size: int, drop_last: bool) -> int:
    full, short = batch_sizes(remaining, batch_size, drop_last)
    return full * batch_size + short


def deliver(
    consumed: int, remaining: Sequence[int], batch_size: int, drop_last: bool
) -> tuple[list[int], int]:
    """Samples taken from each worker (``remaining``: what each yields this pass) once
    ``consumed`` were handed out, and the id of the worker whose batch comes next; a
    ConfigError when ``consumed`` is off a batch boundary or more than the workers yield."""
    workers = len(remaining)
    shape = [batch_sizes(r, batch_size, drop_last) for r in remaining]
    batches = [full + (short > 0) for full, short in shape]
    taken, left, t, last = [0] * workers, consumed, 0, -1
    while left > 0:
        active = [i for i in range(workers) if batches[i] > t]
        if not active:
            raise ConfigError(
                f"{consumed} samples were consumed but this pass yields only "
                f"{sum(taken)}; advance() was called with too many samples"
            )
        sizes = [batch_size if t < shape[i][0] else shape[i][1] for i in active]
        # Rounds up to the next worker running out (or going short) all look alike.
        horizon = min(v for i in range(workers) for v in (shape[i][0], batches[i]) if v > t)
        whole = min(horizon - t, left // sum(sizes))
        if whole:
            for i, size in zip(active, sizes, strict=True):
                taken[i] += whole * size
            left -= whole * sum(sizes)
            t += whole
            last = active[-1]
            continue
        for i, size in zip(active, sizes, strict=True):
            if left == 0:
                break
            if left < size:
                raise ConfigError(
                    f"{consumed} consumed samples do not end on a batch boundary (batch "
                    f"size {batch_size}); call advance() with the size of each whole batch"
                )
            taken[i] += size
            left -= size
            last = i
        t += 1
    return taken, _next_worker(taken, remaining, batch_size, drop_last, last)


def _next_worker(
    taken: list[int], remaining: Sequence[int], batch_size: int, drop_last: bool, last: int
) -> int:
    workers = len(remaining)
    for k in range(1, workers + 1):
        i = (last + k) % workers
        if taken[i] < deliverable(remaining[i], batch_size, drop_last):
            return i
    return 0
