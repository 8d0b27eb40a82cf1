"""An export from start to commit: output checked and locked, pass 1, pass 2, commit.

A crash is harmless: every file is renamed into place and ``config.yaml``, written last,
is the commit point (:mod:`shardex.engine.output` covers replacing a committed export).
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
from shardex.engine.prepare import Prepared, exported_keys, prepare_streamed
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
    """The options, from ``options=`` or keyword arguments (NeMo's ``images_per_tar`` too)."""
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
    """:func:`shardex.export`, plus a ``runner`` (default: local processes), the
    ``pipeline`` stages and ``spec_fingerprint`` to record, and a ``lock`` the caller holds.
    """
    check_options(opts)  # before the source is looked at
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
    """One export run: its source, backend, runner and hold on the output."""

    src: Source
    backend: Backend
    runner: Runner | None
    out: Transaction


def _write(job: _Job, bars: Progress) -> tuple[Prepared, Written]:
    """Pass 1 and pass 2; a sample refused while writing undoes this run's files once the
    workers are done."""
    storage, opts = job.out.storage, job.out.opts
    # remote tasks hand rows and index arrays over through the output's staging, and
    # keep what their scan read for the shard tasks
    staging = new_staging() if job.runner is not None and job.runner.remote else None
    held = tars_held() if staging is not None else contextlib.nullcontext()
    with scratch() as folder, _staged(storage, staging), held:
        taken = exported_keys(storage, job.out.previous, folder)
        started: list[Runner] = []
        with contextlib.ExitStack() as early:

            def start_workers() -> None:
                """Start the workers during pass 1 (the bytes are not in this process)."""
                if job.runner is None and opts.workers != 1 and not started:
                    started.append(early.enter_context(_runner(job, opts.workers)))

            prep = _prepare_first(job, bars, taken, folder, start_workers)
            # bytes in this process are written here: pickling them costs more
            workers = 1 if prep.in_memory() else opts.workers
            if workers == 1:
                early.close()
                started.clear()
            # workers started in pass 1 stop with the pool below, before an undo
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
                    job.out.previous,
                    job.out.committed,
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
    """Remove the run's staged parts once the runner's tasks have all settled."""
    try:
        yield
    finally:
        if staging is not None:
            remove_staging(storage, staging)


def _check_one_split(job: _Job, prep: Prepared) -> None:
    names = list(
        dict.fromkeys([*(job.out.previous.splits if job.out.previous else ()), *prep.splits])
    )
    if job.out.opts.layout == "flat" and len(names) > 1:
        raise ConfigError(
            f"layout='flat' holds one split, and {job.src.uri} gives {len(names)} "
            f"({', '.join(map(repr, names))}); export one split (--split NAME), or use the "
            "default layout (a folder per split)"
        )


def _runner(job: _Job, workers: int | None) -> Runner:
    return Runner(workers, preload=("shardex.engine.shards", type(job.backend).__module__))


def _prepare_first(
    job: _Job,
    bars: Progress,
    taken: frozenset[str],
    folder: Path,
    start_workers: Callable[[], None],
) -> Prepared:
    """Pass 1, streamed, the splits spilled under ``folder``; ``start_workers`` is called
    once the first batch shows the bytes are not in this process."""
    # remote tasks scan the source's files too, else every tar's bytes would pass here
    remote = job.runner if job.runner is not None and job.runner.remote else None
    with contextlib.ExitStack() as stack:
        if remote is not None:
            stack.enter_context(remote)  # entered again for pass 2: connecting is idempotent
        else:  # what a local tar scan reads is kept for the shard writers
            local = job.out.storage.root if isinstance(job.out.storage, LocalStorage) else None
            stack.enter_context(copies_kept(folder / "tars", local))
        stream = job.src.stream_on(remote)
        batches = iter(stream.batches)
        first = next(batches, None)
        replay = SampleStream(
            itertools.chain([first] if first is not None else [], batches), stream.label_names
        )
        inline = first is not None and Members.of(first.table.column(MEMBERS)).mostly_inline()
        # bytes in this process stay where they are, and are written here
        pin = inline and job.src.bytes_in_memory
        if remote is None and not pin:
            start_workers()
        put = remote.put if remote is not None and not pin else None  # rows in its store
        return prepare_streamed(
            replay,
            job.src.uri,
            job.out.opts,
            job.backend,
            folder,
            bars,
            taken,
            job.out.previous,
            put,
            pin,
        )


def _config(
    job: _Job,
    prep: Prepared,
    written: Written,
    pipeline: tuple[dict[str, Any], ...],
    spec_fingerprint: str | None,
) -> ExportConfig:
    errors_file, errors_checksum = write_errors(
        job.out.storage, written.skipped, job.out.previous, job.out.committed
    )
    config = contract(
        prep,
        job.src,
        job.out.opts,
        job.backend,
        written.splits,
        combined_digest(written.digests),
        errors_file,
        job.out.previous,
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
