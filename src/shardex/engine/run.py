"""An export from start to commit: the output checked and locked, pass 1 (prepare), pass 2
(write), then the commit. :func:`run_export` is the internal entry point (pipelines and Ray
pass their runner, stages and spec fingerprint); :func:`shardex.export` calls it.

The order of work makes a crash harmless: shards, Parquet files and index files are each
written under a temporary name and renamed into place; ``config.yaml`` is written last and
is the commit point, so a reader never takes a half-written folder for an export (see
:mod:`shardex.engine.output` for replacing and extending a committed export).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from shardex.backends.base import Backend
from shardex.backends.registry import check_options, get_backend
from shardex.contract import ExportConfig
from shardex.engine.commit import combined_digest, contract, write_errors
from shardex.engine.output import check_root, command_digest
from shardex.engine.prepare import (
    Prepared,
    exported_keys,
    prepare,
    prepare_streamed,
    streamable,
)
from shardex.engine.transaction import Transaction
from shardex.engine.write import Written, write_splits
from shardex.errors import ConfigError, EmptySourceError, SourceError, mode_hint
from shardex.options import ExportOptions
from shardex.parallel import Runner
from shardex.progress import Progress
from shardex.refs.members import Members
from shardex.refs.scan import MEMBERS, SampleStream
from shardex.sources import Source, open_source
from shardex.storage import LocalStorage, Storage, open_storage
from shardex.storage.fetch.held import tars_held
from shardex.storage.fetch.tars import copies_kept
from shardex.storage.lock import OutputLock
from shardex.storage.scratch import scratch
from shardex.storage.staging import new_staging, remove_staging


def export_options(options: ExportOptions | None, kwargs: dict[str, Any]) -> ExportOptions:
    """The options, from ``options=`` or keyword arguments (NeMo's ``images_per_tar`` is
    ``samples_per_shard``)."""
    if "images_per_tar" in kwargs:
        kwargs["samples_per_shard"] = kwargs.pop("images_per_tar")
    if options is not None and kwargs:
        raise ConfigError("pass either options= or keyword options, not both")
    return options if options is not None else ExportOptions(**kwargs)


def run_export(
    source: str | os.PathLike[str] | Source | Mapping[str, Any],
    output: str | os.PathLike[str] | Storage,
    opts: ExportOptions,
    *,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_storage_options: dict[str, Any] | None = None,
    runner: Runner | None = None,
    pipeline: tuple[dict[str, Any], ...] = (),
    spec_fingerprint: str | None = None,
    lock: OutputLock | None = None,
) -> ExportConfig:
    """Export a dataset and return the committed contract (see :func:`shardex.export`).

    ``runner``: where parallel work runs (a pipeline executor's; default: ``workers``
    local processes); ``pipeline``: the stages applied before export and
    ``spec_fingerprint``: the hash of the spec file followed (both recorded).
    ``source_storage_options``: those of a source on object storage (default: the
    output's ``storage_options``). ``lock``: the output's lock, which the caller already
    holds and gives back itself (``write_shardex`` holds it from staging to commit).
    """
    check_options(opts)  # what the backend cannot store: before the source is looked at
    given = source_storage_options if source_storage_options is not None else storage_options
    src = open_source(source, given)
    backend = get_backend(opts.backend, opts.backend_options)
    if opts.layout == "flat" and not backend.capabilities.flat_layout:
        raise ConfigError(
            f"the {backend.name} backend cannot write layout='flat' (one split at the output's "
            "top level); use the webdataset backend, or the default layout"
        )
    if opts.mode == "append" and not backend.capabilities.append:
        raise ConfigError(
            f"the {backend.name} backend cannot append to an export; export the combined "
            f"source again with {mode_hint('overwrite')} (the webdataset backend can append)"
        )
    storage = open_storage(output, storage_options)
    check_root(storage)
    command = command_digest(src, opts, pipeline, spec_fingerprint)
    with Transaction(storage, opts, command, backend, lock) as out:
        if out.done is not None:
            return out.done
        job = _Job(src, backend, runner, out)
        with Progress(progress) as bars:
            prep, written = _write(job, bars)
            config = _config(job, prep, written, pipeline, spec_fingerprint)
            out.commit(config)
    return config


@dataclasses.dataclass(frozen=True, slots=True)
class _Job:
    """One export run: its source, backend and runner, and its hold on the output."""

    src: Source
    backend: Backend
    runner: Runner | None
    out: Transaction

    @property
    def storage(self) -> Storage:
        return self.out.storage

    @property
    def opts(self) -> ExportOptions:
        return self.out.opts

    @property
    def previous(self) -> ExportConfig | None:
        return self.out.previous

    @property
    def committed(self) -> frozenset[str]:
        return self.out.committed


def _write(job: _Job, bars: Progress) -> tuple[Prepared, Written]:
    """Pass 1 and pass 2. A sample refused while writing (one pass over the bytes finds
    bad images only then) undoes this run's files once the workers are done."""
    storage, opts = job.storage, job.opts
    # a remote runner's tasks hand their shards' rows and index arrays over through the
    # output (see shardex.storage.staging): this run's parts, gone when it ends however it
    # ends (a killed run's went when the lock was taken)
    staging = new_staging() if job.runner is not None and job.runner.remote else None
    # a remote runner's scan tasks keep what they read for its shard tasks (see
    # shardex.storage.fetch.held): held from the scan until the shards are written
    held = tars_held() if staging is not None else contextlib.nullcontext()
    with scratch() as folder, _staged(storage, staging), held:
        taken = exported_keys(storage, job.previous, folder)
        started: list[Runner] = []
        with contextlib.ExitStack() as early:

            def start_workers() -> None:
                """The source's bytes are not in this process: the workers start now,
                while the rest of pass 1 runs, instead of after it."""
                if job.runner is None and opts.workers != 1 and not started:
                    started.append(early.enter_context(_runner(job, opts.workers)))

            prep = _prepare_first(job, bars, taken, folder, start_workers)
            # bytes in this process (an in-memory source) are written here: pickling
            # costs more (most of a first batch's bytes were files, not of the rest)
            workers = 1 if prep.in_memory() else opts.workers
            if workers == 1:
                early.close()
                started.clear()
            # the workers started in pass 1 stop with the pool below: before an undo
            kept = early.pop_all()
        try:
            runner = started[0] if started else job.runner or _runner(job, workers)
            with kept, contextlib.nullcontext(runner) if started else runner as pool:
                _check_one_split(job, prep)
                job.out.begin()  # before the first write
                written = write_splits(
                    storage,
                    job.backend,
                    prep,
                    opts,
                    pool,
                    bars,
                    job.previous,
                    job.committed,
                    staging,
                )
            if sum(i.num_samples for i in written.splits.values()) == 0:
                raise EmptySourceError(
                    f"every sample of {job.src.uri} was skipped; nothing to export"
                )
        except SourceError:
            job.out.undo()
            raise
    return prep, written


@contextlib.contextmanager
def _staged(storage: Storage, staging: str | None) -> Iterator[None]:
    """Remove the run's parts at the end (after the runner's tasks have all settled)."""
    try:
        yield
    finally:
        if staging is not None:
            remove_staging(storage, staging)


def _check_one_split(job: _Job, prep: Prepared) -> None:
    """The flat layout holds one split: refuse more before anything is written."""
    names = list(dict.fromkeys([*(job.previous.splits if job.previous else ()), *prep.splits]))
    if job.opts.layout == "flat" and len(names) > 1:
        raise ConfigError(
            f"layout='flat' holds one split, and {job.src.uri} gives {len(names)} "
            f"({', '.join(map(repr, names))}); export one split (--split NAME), or use the "
            "default layout (a folder per split)"
        )


def _runner(job: _Job, workers: int | None) -> Runner:
    """Local workers that import the shard writers as they start."""
    return Runner(workers, preload=("shardex.engine.shards", type(job.backend).__module__))


def _prepare_first(
    job: _Job,
    bars: Progress,
    taken: frozenset[str],
    folder: Path,
    start_workers: Callable[[], None],
) -> Prepared:
    """Pass 1 before the shards are written (the shard writers check images as they write
    them): streamed, the splits spilled under ``folder`` (appends too), unless the
    source's bytes are in memory (its first batch tells); ``start_workers`` is called once
    the first batch shows that the bytes are not in memory. A remote runner (Ray) streams
    too: its shard jobs carry their spill slices' rows, since its tasks may run on
    machines that do not see this one's scratch."""
    if not streamable(job.opts):
        return prepare(job.src, job.opts, bars, job.previous, taken)
    # a remote runner's tasks also scan the source's files (a tar source's headers: on
    # object storage, else every tar's bytes would pass through this process)
    remote = job.runner if job.runner is not None and job.runner.remote else None
    with contextlib.ExitStack() as stack:
        if remote is not None:
            stack.enter_context(remote)  # entered again for pass 2: connecting is idempotent
        else:  # shards are written on this machine: what a tar scan reads is kept for them
            local = job.storage.root if isinstance(job.storage, LocalStorage) else None
            stack.enter_context(copies_kept(folder / "tars", local))
        stream = job.src.stream_on(remote)
        batches = iter(stream.batches)
        first = next(batches, None)
        replay = SampleStream(
            itertools.chain([first] if first is not None else [], batches), stream.label_names
        )
        inline = first is not None and Members.of(first.table.column(MEMBERS)).mostly_inline()
        if inline and job.src.bytes_in_memory:
            return prepare(_Replay(job.src, replay), job.opts, bars, job.previous, taken)
        if remote is None:
            start_workers()
        put = remote.put if remote is not None else None  # rows kept in its object store
        return prepare_streamed(
            replay, job.src.uri, job.opts, job.backend, folder, bars, taken, job.previous, put
        )


class _Replay(Source):
    """A source whose stream has begun: the rest of it, its first batch put back."""

    kind = "replay"

    def __init__(self, src: Source, stream: SampleStream) -> None:
        self.uri, self._stream = src.uri, stream

    def stream(self) -> SampleStream:
        return self._stream


def _config(
    job: _Job,
    prep: Prepared,
    written: Written,
    pipeline: tuple[dict[str, Any], ...],
    spec_fingerprint: str | None,
) -> ExportConfig:
    """errors.parquet, then the contract of what was written."""
    errors_file, errors_checksum = write_errors(
        job.storage, written.skipped, job.previous, job.committed
    )
    config = contract(
        prep,
        job.src,
        job.opts,
        job.backend,
        written.splits,
        combined_digest(written.digests),
        errors_file,
        job.previous,
        num_skipped=len(written.skipped),
    )
    return dataclasses.replace(
        config,
        pipeline=tuple(pipeline),
        spec_fingerprint=spec_fingerprint,
        metadata_file=written.metadata_file,
        metadata_checksum=written.metadata_checksum,
        errors_checksum=errors_checksum,
    )
