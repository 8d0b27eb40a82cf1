"""Pass 2 of an export: a split's shards written from its candidate samples.

The writer reads each candidate once and takes good ones until the shard is full, so shards
stay exactly filled when bad images are found only here. Jobs are planned speculatively
(every candidate good); when a shard skipped some, the shards in flight after it are
discarded and planning restarts from the true position: always correct, costly only with
bad samples. In-memory samples are written inline (pickling costs more); workers get
references only, remote ones carrying spilled rows or object-store handles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar

import pyarrow as pa

from shardex.parallel import Runner
from shardex.planning import plan_bounds
from shardex.refs.candidates import Candidates, spilled_candidates
from shardex.refs.rows import SpilledRows

if TYPE_CHECKING:
    from shardex.backends.base import Backend, SplitPlan, StagedRows
    from shardex.contract import SplitInfo
    from shardex.storage.base import Storage

#: Candidates a worker's job carries beyond its planned end, for skips (then doubled).
_SLACK: Final = 8


class _Job(Protocol):
    """A shard job (a dataclass carrying its candidates)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def candidates(self) -> Candidates: ...


class _Done(Protocol):
    @property
    def consumed(self) -> int: ...

    @property
    def complete(self) -> bool: ...

    @property
    def num_samples(self) -> int: ...

    @property
    def skipped(self) -> Sequence[dict[str, str]]: ...


J = TypeVar("J", bound=_Job)
D = TypeVar("D", bound=_Done)

#: (start, stop, first sample number, shard number offset) -> the job's fields it decides.
MakeJob = Callable[[int, int, int, int], J]


def _carried(jobs: Iterator[J]) -> Iterator[J]:
    """Jobs for remote workers, carrying their spilled rows (each spill batch read once)."""
    read: dict[int, pa.RecordBatch] = {}
    for job in jobs:
        if job.candidates.spill is None:
            yield job
        else:
            yield dataclasses.replace(job, candidates=job.candidates.carried(read))


def _jobs(
    make_job: MakeJob[J],
    bounds: tuple[tuple[int, int], ...],
    n: int,
    at: int,
    first: int,
    k: int,
    extra: int,
    stop: list[bool],
) -> Iterator[J]:
    """One round's jobs, made lazily until ``stop[0]``, each ``extra`` candidates long."""
    for q, (a, b) in enumerate(bounds):
        if stop[0]:
            return
        yield make_job(at + a, min(n, at + b + extra), first, k + q)
        first += b - a


def write_shards(
    split: SpilledRows,
    make_job: MakeJob[J],
    runner: Runner,
    samples_per_shard: int,
    max_shard_bytes: int | None,
    *,
    inline: bool,
    on_discard: Callable[[D], None],
    write: Callable[[J], D],
) -> Iterator[D]:
    """The split's shards in order, full but the last (which may be empty, holding only
    skipped samples); ``on_discard`` gets each speculative shard that was replaced."""
    n = split.num_samples
    pos = sample = number = 0
    slack = _SLACK
    while pos < n:
        bounds = plan_bounds(split.sizes[pos:], samples_per_shard, max_shard_bytes)
        stop = [False]
        round_pos = pos
        jobs = _jobs(make_job, bounds, n, pos, sample, number, slack, stop)
        todo = _carried(jobs) if runner.remote and not inline else jobs
        results = map(write, todo) if inline else runner.imap(write, todo)
        more = False
        for q, done in enumerate(results):
            if stop[0]:
                on_discard(done)
                continue
            a, b = bounds[q]
            if not done.complete:  # ran out of candidates: the same shard with more
                on_discard(done)
                stop[0] = more = True
                continue
            pos = round_pos + a + done.consumed
            # yielded even when empty: its skipped samples go to errors.parquet
            yield done
            if done.num_samples:
                sample += done.num_samples
                number += 1
            if done.consumed != b - a or done.num_samples != b - a:
                stop[0] = True  # skipped candidates: plan the rest again from here
        if more:
            slack *= 2
        elif not stop[0]:
            pos = n


def write_split(
    storage: Storage,
    backend: Backend,
    plan: SplitPlan,
    runner: Runner,
    on_shard: Callable[[pa.Table | StagedRows, int], None],
) -> SplitInfo:
    """Write a split through the backend's :class:`~shardex.backends.base.SplitWriter`;
    skipped samples go to ``plan.on_skip`` before their shard is added."""
    split = plan.candidates
    # this process writes in-memory bytes itself, and everything with one local worker
    inline = split.inline() or (runner.workers == 1 and not runner.remote)
    with backend.split_writer(storage, plan, remote=runner.remote and not inline) as out:

        def job(start: int, stop: int, first_sample: int, k: int) -> Any:
            return out.job(spilled_candidates(split, start, stop), first_sample, k)

        sizes = plan.samples_per_shard, plan.max_shard_bytes
        shards = write_shards(
            split, job, runner, *sizes, inline=inline, on_discard=out.discard, write=out.write
        )
        for done in shards:
            if done.skipped and plan.on_skip is not None:
                plan.on_skip(list(done.skipped))
            if done.num_samples:  # not the split's last candidates, all of them skipped
                on_shard(*out.add(done))
        return out.finish(runner)
