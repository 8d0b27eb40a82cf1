"""Export: scan a source, check samples, split, plan shards, write, commit config.yaml.

The order of work makes a crash harmless: shards, Parquet files and index files are each
written under a temporary name and renamed into place; ``config.yaml`` is written last and
is the commit point, so a reader never takes a half-written folder for an export.

Replacing or extending a committed export follows one rule: nothing writes a file that the
committed config.yaml names. New files take names the committed export does not use (a
shard's second name, ``index-samples.2.npy``, ``metadata.2.parquet``: see
:func:`shardex.backends.base.unused_name`), the new config.yaml commits in one atomic
put, and the old export's files are deleted after it. The names depend only on the
committed config.yaml and the input, so an export killed at any point and run again
writes the same files. Every writer holds the output's lock (:mod:`shardex.storage.lock`)
and records what it is doing in ``.shardex-intent.json`` (removed when it ends), so that a
run after a kill knows whether the killed one had committed: then only its clean-up is
left to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from shardex import __version__
from shardex.api import read_config
from shardex.backends.base import Backend, SplitPlan, unused_name
from shardex.backends.registry import get_backend
from shardex.checks import check_samples
from shardex.contract import (
    CONFIG_FILE,
    ERRORS_FILE,
    FORMAT_VERSION,
    LABEL_PREFIX,
    METADATA_FILE,
    ExportConfig,
    FieldSpec,
    IndexInfo,
    SourceInfo,
    SplitInfo,
)
from shardex.engine.write import SplitRows
from shardex.errors import (
    ConfigError,
    EmptySourceError,
    ExportError,
    ObjectNotFoundError,
    OutputExistsError,
    ShardexError,
    SourceError,
)
from shardex.fields import add_members, cast_members, column_members, field_specs, with_columns
from shardex.format.shard import JSON_COLUMN, SampleCheck, parquet_file, sample_sizes
from shardex.format.tables import read_checked_table
from shardex.options import ExportOptions, Mode, OnError, parse_split_fractions
from shardex.parallel import Runner
from shardex.planning import (
    assign_splits,
    content_digest,
    drop_unselected_members,
    fixed_lists,
    key_specs,
    member_keys,
    name_hash,
    plan_bounds,
    select_keys,
    split_names,
)
from shardex.progress import Progress
from shardex.rows import Members
from shardex.sources import Source, open_source
from shardex.sources.base import MEMBERS
from shardex.storage import Storage, open_storage
from shardex.storage.local import check_output_folder
from shardex.storage.lock import LOCK_FILE, holder_text

__all__ = ["ExportOptions", "OnError", "export", "parse_split_fractions"]

#: What a writer records before it writes anything (see :func:`_intent`).
INTENT_FILE: Final = ".shardex-intent.json"
#: Files of a writer at work, never part of an export.
_CONTROL: Final = frozenset({INTENT_FILE, LOCK_FILE})
# (".pending" names: the leftovers of shardex versions that renamed after committing)
_OURS: Final = re.compile(
    r"^(config\.yaml|\.shardex-intent\.json|\.shardex-lock|metadata(\.pending|\.2)?\.parquet|"
    r"errors(\.2)?\.parquet|"
    r"[^/]+/(images-[0-9a-f]+-\d{6}\.(tar|parquet|idx)|index-(samples|keys)(\.pending|\.2)?\.npy"
    # the array backends: every path under a split starts with its kind and content hash
    r"|(arrays|tensordict|zarr|tensors|samples)-[0-9a-f]+(-\d{6})?([./-].*)?))$"
)
_CHUNK: Final = 2000


# ---------------------------------------------------------------- output handling


def _check_root(storage: Storage) -> None:
    root = storage.local_path("")
    if root is not None:
        check_output_folder(root)


def _check_output(storage: Storage, mode: Mode) -> list[str]:
    """Refuse what the mode does not allow; return the old files to replace or resume."""
    existing = [p for p in storage.list() if p != LOCK_FILE]
    foreign = [p for p in existing if not _OURS.match(p)]
    if foreign:
        raise OutputExistsError(
            f"output {storage.uri} holds files shardex did not write (e.g. {foreign[0]!r}); "
            "export into an empty or new folder"
        )
    committed = CONFIG_FILE in existing
    if mode == "append" and not committed:
        raise OutputExistsError(
            f"output {storage.uri} holds no complete export to append to (no {CONFIG_FILE})"
        )
    if committed and mode == "resume":
        raise OutputExistsError(
            f"output {storage.uri} holds a complete export: nothing to resume "
            "(use mode 'overwrite' to write it again)"
        )
    if (existing or storage.leftovers()) and mode == "error":
        what = "holds an export" if committed else "holds the files of an unfinished export"
        hint = "--overwrite to replace it" + (
            "" if committed else ", or --mode resume to finish it"
        )
        raise OutputExistsError(f"output {storage.uri} {what}; pass {hint}")
    storage.remove_leftovers()  # temporary files of a killed export
    return existing


def export_files(config: ExportConfig) -> list[str]:
    """Every file of an export but config.yaml (a shard that is a folder, as the ``numpy``
    backend's, is named by its folder)."""
    files = [f for f in (config.metadata_file, config.errors_file) if f]
    for info in config.splits.values():
        files += [p for s in info.shards for p in (s.path, s.metadata, s.dali_index) if p]
        if info.index is not None:
            files += [info.index.samples, info.index.keys]
        files += info.files
    return list(dict.fromkeys(files))


def _remove_stale(storage: Storage, old_files: list[str], config: ExportConfig) -> None:
    """Delete files of a replaced export that the new one does not have."""
    keep = {CONFIG_FILE, *export_files(config)}
    # A shard that is a folder of files config.yaml does not list (the numpy backend's)
    # keeps what is under it; every other file must be listed itself.
    listed = [f for info in config.splits.values() for f in info.files]
    folders = {
        s.path
        for info in config.splits.values()
        for s in info.shards
        if not any(f.startswith(f"{s.path}/") for f in listed)
    }
    for path in old_files:
        parents = (path[:i] for i, c in enumerate(path) if c == "/")
        if path not in keep | _CONTROL and not any(p in folders for p in parents):
            storage.delete(path)


def _write_errors(
    storage: Storage,
    skipped: list[dict[str, str]],
    previous: ExportConfig | None = None,
    taken: frozenset[str] = frozenset(),
) -> tuple[str | None, str | None]:
    """errors.parquet: one row per skipped sample with the reason (when appending, the
    export's earlier rows first); its name and whole-file checksum."""
    if previous is not None and previous.errors_file:
        old = read_checked_table(storage, previous.errors_file, previous.errors_checksum)
        skipped = old.to_pylist() + skipped
    if not skipped:
        return None, None
    table = pa.Table.from_pylist(
        skipped,
        schema=pa.schema(
            [("key", pa.string()), ("original_path", pa.string()), ("reason", pa.string())]
        ),
    )
    name = unused_name(ERRORS_FILE, taken)
    with storage.open_writer(name) as out:
        pq.write_table(table, sink := parquet_file(out))
    return name, sink.checksum


def _fingerprint(digests: list[str]) -> str:
    return str(xxhash.xxh3_128("\n".join(digests).encode()).hexdigest())


class _MetadataSink:
    """Streams shard rows into metadata.parquet as shards complete."""

    def __init__(self, storage: Storage, name: str = METADATA_FILE) -> None:
        self._out = storage.open_writer(name)
        self._file = parquet_file(self._out)
        self._writer: pq.ParquetWriter | None = None
        self.num_rows = 0
        #: The file's whole-file checksum, once committed (for config.yaml).
        self.checksum: str | None = None

    def __call__(self, table: pa.Table) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._file, table.schema, compression="zstd")
        self._writer.write_table(table)
        self.num_rows += table.num_rows

    def commit(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._out.commit()
        self.checksum = self._file.checksum

    def abort(self) -> None:
        if self._writer is not None:  # closed here, or its finaliser writes to a dead file
            with contextlib.suppress(Exception):
                self._writer.close()
        self._out.abort()


@dataclass(frozen=True, slots=True)
class _Prepared:
    """The checked, split sample table and the decisions made about it."""

    table: pa.Table
    fields: tuple[FieldSpec, ...]
    skipped: list[dict[str, str]]
    split_method: str
    splits: list[str]
    x_keys: tuple[str, ...]
    y_keys: tuple[str, ...]
    with_label: bool
    write_label: bool
    label_names: tuple[str, ...] | None
    #: The members of ``table`` (for backends that write shard by shard).
    members: Members | None = None

    def in_memory(self) -> bool:
        """Whether most of the samples' bytes are in this process (an in-memory source):
        then they are written here, as pickling them to workers costs more."""
        m = self.members
        return m is not None and m.inline_bytes() * 2 > int(m.size.sum())


def _prepare(
    src: Source,
    opts: ExportOptions,
    runner: Runner | None,
    bars: Progress,
    previous: ExportConfig | None = None,
    taken: frozenset[str] = frozenset(),
) -> _Prepared:
    """Scan, check, split and select keys; nothing is written yet. Images are checked
    here only without a runner's absence: ``runner=None`` leaves them to the shard writer
    (one pass over the bytes).

    When appending, ``previous`` is the committed export: its split rule, label names and
    keys apply to the new samples, and ``taken`` are its keys.
    """
    scanning = bars.task(f"scanning {src.uri}", None)
    scan = src.scan()
    scanning.done()
    table, skipped = check_samples(
        fixed_lists(scan.table),
        opts,
        runner or Runner(1),
        bars,
        taken,
        scan.left_out,
        images=runner is not None,
    )
    if table.num_rows == 0:
        raise EmptySourceError(f"every sample of {src.uri} was skipped; nothing to export")
    with_label = opts.labels and "label" in table.column_names
    if "label" in table.column_names and not with_label:
        table = table.drop_columns(["label"])
    label_names = scan.label_names if with_label else None
    if previous is not None and with_label:
        table, label_names = _relabel(table, label_names, previous)
    table, split_method = assign_splits(table, opts)
    start = previous.num_samples if previous is not None else 0
    table = table.append_column("export_index", pa.array(np.arange(start, start + table.num_rows)))
    members = member_keys(table)
    internal = {MEMBERS, JSON_COLUMN, "key", "original_path", "split", "label", "export_index"}
    available = [
        *members,
        *(["label"] if with_label else []),
        *[c for c in table.column_names if c not in internal],
    ]
    x_keys, y_keys = select_keys(opts, available, list(members), with_label)
    table = drop_unselected_members(table, members, x_keys, y_keys)
    # metadata columns asked for as keys are stored as sample fields (NAME.npy / NAME.txt)
    as_fields = [k for k in (*x_keys, *y_keys) if k not in members and k != "label"]
    if as_fields:
        table = add_members(table, [column_members(table.column(k), k) for k in as_fields])
    if opts.dtype is not None:
        table = cast_members(table, opts.dtype)
    write_label = with_label and "label" in (*x_keys, *y_keys)
    label_prefix = previous.label_prefix if previous is not None else LABEL_PREFIX
    return _Prepared(
        table=table,
        fields=with_columns(field_specs(table, write_label), y_keys, label_prefix),
        skipped=skipped,
        split_method=previous.split_method if previous is not None else split_method,
        splits=split_names(table, opts),
        x_keys=x_keys,
        y_keys=y_keys,
        with_label=with_label,
        write_label=write_label,
        label_names=label_names,
        members=Members.of(table.column(MEMBERS)) if runner is None else None,
    )


def _appending_options(opts: ExportOptions, previous: ExportConfig) -> ExportOptions:
    """New samples are split the way the export was, and keep its keys."""
    fractions = previous.split_method == "fractions"
    return dataclasses.replace(
        opts,
        split_fractions=previous.split_fractions if fractions else None,
        seed=(previous.split_seed or 0) if fractions else opts.seed,
        x_keys=previous.x_keys,
        y_keys=previous.y_keys,
    )


def _relabel(
    table: pa.Table, names: tuple[str, ...] | None, previous: ExportConfig
) -> tuple[pa.Table, tuple[str, ...] | None]:
    """Label numbers of appended samples follow the export's label names."""
    if not (names and previous.label_names) or names == previous.label_names:
        return table, previous.label_names or names
    number = {name: i for i, name in enumerate(previous.label_names)}
    unknown = sorted(set(names) - set(number))
    if unknown:
        raise ConfigError(
            f"appended samples have labels the export does not know: {', '.join(unknown)} "
            f"(its labels: {', '.join(previous.label_names)})"
        )
    mapping = [number[name] for name in names]
    labels = [None if v is None else mapping[v] for v in table.column("label").to_pylist()]
    column = table.column_names.index("label")
    return table.set_column(column, "label", pa.array(labels, pa.int64())), previous.label_names


def _contract(
    prep: _Prepared,
    src: Source,
    opts: ExportOptions,
    backend_name: str,
    written: dict[str, SplitInfo],
    fingerprint: str,
    errors_file: str | None,
    previous: ExportConfig | None = None,
    num_skipped: int = 0,
) -> ExportConfig:
    """The config.yaml of what was written (``num_skipped``: samples skipped in all)."""
    table = prep.table
    num_classes = None
    if prep.with_label:
        top = pc.max(table.column("label")).as_py()
        num_classes = (
            len(prep.label_names) if prep.label_names else (None if top is None else top + 1)
        )
    columns = [c for c in table.column_names if c not in ("export_index", JSON_COLUMN)]
    where = "tar" if backend_name == "webdataset" else backend_name
    specs = key_specs(table.select(columns), prep.fields, prep.x_keys, prep.y_keys, where)
    fractions = prep.split_method == "fractions"
    return ExportConfig(
        format_version=previous.format_version if previous else FORMAT_VERSION,
        backend=backend_name,
        num_samples=sum(s.num_samples for s in written.values()),
        splits=written,
        key_specs=specs,
        x_keys=prep.x_keys,
        y_keys=prep.y_keys,
        writer={"name": "shardex", "version": __version__},
        shardex_version=__version__,
        label_names=prep.label_names,
        num_classes=num_classes,
        feature_shapes={
            s.key: list(s.shape) for s in specs if s.key in prep.x_keys and s.shape is not None
        },
        source_datasets=(
            *(previous.source_datasets if previous else ()),
            SourceInfo(src.uri, src.kind, table.num_rows + len(prep.skipped), fingerprint),
        ),
        source_fingerprint=(
            _fingerprint([previous.source_fingerprint, fingerprint]) if previous else fingerprint
        ),
        split_seed=opts.seed if fractions else None,
        split_fractions=dict(opts.split_fractions or {}) if fractions else None,
        split_method=prep.split_method,
        shard_options={
            "samples_per_shard": opts.samples_per_shard,
            "max_shard_bytes": opts.max_shard_bytes,
            "naming": "deterministic" if opts.deterministic_name else "random",
            "validate": opts.validate,
            "on_error": opts.on_error,
            **({"dtype": opts.dtype} if opts.dtype else {}),
            **({"backend_options": dict(opts.backend_options)} if opts.backend_options else {}),
        },
        errors_file=errors_file,
        num_skipped=num_skipped + (previous.num_skipped if previous else 0),
        extra=dict(opts.extra),
        fields=prep.fields,
    )


def export(
    source: str | os.PathLike[str] | Source | Mapping[str, Any],
    output: str | os.PathLike[str] | Storage,
    options: ExportOptions | None = None,
    *,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    runner: Runner | None = None,
    pipeline: tuple[dict[str, Any], ...] = (),
    spec_fingerprint: str | None = None,
    **kwargs: Any,
) -> ExportConfig:
    """Export a dataset; returns the committed contract.

    Args:
        source: a path, table, tar glob, ``demo``, an existing export, a mapping of names
            to arrays, or a Source (see :func:`open_source`).
        output: the export's folder or URL (or a Storage).
        options: an ExportOptions; or pass its fields as keyword arguments
            (``samples_per_shard=500``, ``split_fractions={"train": 0.9, "val": 0.1}``,
            ``mode="resume"`` ...; NeMo's ``images_per_tar`` is accepted for
            ``samples_per_shard``).
        progress: show progress bars.
        storage_options: options for object storage (see docs/storage.md).
        runner: where parallel work runs (a pipeline executor's); default: ``workers``
            local processes.
        pipeline: the stages applied before export, recorded in config.yaml.
        spec_fingerprint: the hash of the spec file this export follows (recorded).

    Raises:
        OutputExistsError: the output holds an export (or an unfinished one) and ``mode``
            does not allow replacing or resuming it.
        BadSampleError: a sample is corrupt (and ``on_error`` is ``"error"``).
        SourceError: the source is missing, empty or malformed.
    """
    if "images_per_tar" in kwargs:
        kwargs["samples_per_shard"] = kwargs.pop("images_per_tar")
    if options is not None and kwargs:
        raise ConfigError("pass either options= or keyword options, not both")
    opts = options if options is not None else ExportOptions(**kwargs)
    src = open_source(source)
    backend = get_backend(opts.backend, opts.backend_options)
    if opts.mode == "append" and not backend.capabilities.append:
        raise ConfigError(
            f"the {backend.name} backend cannot append to an export; export the combined "
            "source again with --overwrite (the webdataset backend can append)"
        )
    storage = open_storage(output, storage_options)
    _check_root(storage)
    command = _command(src, opts, pipeline, spec_fingerprint)
    with storage.lock(holder_text(f"export --mode {opts.mode}")) as lock:
        repaired = _promote_legacy(storage) if opts.mode != "error" else None
        done = _finish_committed(storage, opts.mode, command, repaired is not None)
        if done is not None:
            return done
        opts = _resumed(storage, opts, command)
        old_files = _check_output(storage, opts.mode)
        committed = _committed_files(storage, old_files)
        previous = read_config(storage) if opts.mode == "append" else None
        if previous is not None:
            opts = _appending_options(opts, previous)
        with Progress(progress) as bars:
            taken = _exported_keys(storage, previous)
            one_pass = backend.writes_shards
            prep = _prepare(src, opts, None, bars, previous, taken) if one_pass else None
            workers = 1 if prep is not None and prep.in_memory() else opts.workers
            intent_before = _read_intent_bytes(storage)
            writing = False
            try:
                with runner or Runner(workers) as pool:
                    if prep is None:
                        prep = _prepare(src, opts, pool, bars, previous, taken)
                    skipped = list(prep.skipped)
                    _record_intent(storage, opts.mode, command)  # before the first write
                    writing = True
                    written, digests, metadata_file, metadata_checksum = _write_splits(
                        storage, backend, prep, opts, pool, bars, previous, committed, skipped
                    )
                if sum(i.num_samples for i in written.values()) == 0:
                    raise EmptySourceError(
                        f"every sample of {src.uri} was skipped; nothing to export"
                    )
            except SourceError:
                # a sample refused while writing (the workers are done): undo this run
                if writing:
                    _undo(storage, old_files, committed, intent_before)
                raise
            errors_file, errors_checksum = _write_errors(storage, skipped, previous, committed)
            config = _contract(
                prep,
                src,
                opts,
                backend.name,
                written,
                _fingerprint(digests),
                errors_file,
                previous,
                num_skipped=len(skipped),
            )
            config = dataclasses.replace(
                config,
                pipeline=tuple(pipeline),
                spec_fingerprint=spec_fingerprint,
                metadata_file=metadata_file,
                metadata_checksum=metadata_checksum,
                errors_checksum=errors_checksum,
            )
            lock.check()  # an object-store lease that was taken over: commit nothing
            _commit(storage, config)
            _remove_stale(storage, old_files, config)
        storage.delete(INTENT_FILE)
    return config


def _commit(storage: Storage, config: ExportConfig) -> None:
    """Make every file durable, then write config.yaml: the commit point (one atomic put;
    every file it names was written before and is never written again)."""
    storage.sync(export_files(config))
    storage.put(CONFIG_FILE, config.to_yaml().encode())
    storage.sync([CONFIG_FILE])


def _committed_files(storage: Storage, old_files: list[str]) -> frozenset[str]:
    """The files the committed config.yaml names: the new export must not write them."""
    if CONFIG_FILE not in old_files:
        return frozenset()
    try:
        return frozenset(export_files(read_config(storage)))
    except ShardexError:  # an unreadable config.yaml: keep clear of every file there
        return frozenset(old_files)


# ---------------------------------------------------------------- the writer's record


def _command(
    src: Source, opts: ExportOptions, pipeline: tuple[dict[str, Any], ...], spec: str | None
) -> str:
    """What makes two runs the same command: the source and every option that changes
    the output (not the worker count, nor the mode)."""
    fields = {
        f.name: getattr(opts, f.name)
        for f in dataclasses.fields(opts)
        if f.name not in ("workers", "mode", "overwrite")
    }
    text = json.dumps([src.uri, fields, pipeline, spec], sort_keys=True, default=str)
    return str(xxhash.xxh3_64_hexdigest(text.encode()))


def _config_digest(storage: Storage) -> str | None:
    try:
        return str(xxhash.xxh3_64_hexdigest(storage.get(CONFIG_FILE)))
    except ObjectNotFoundError:
        return None


def _record_intent(storage: Storage, mode: Mode, command: str) -> None:
    """Before anything is written: which command writes, over which committed export."""
    record = {"mode": mode, "command": command, "base": _config_digest(storage)}
    storage.put(INTENT_FILE, json.dumps(record).encode())


def _read_intent_bytes(storage: Storage) -> bytes | None:
    try:
        return storage.get(INTENT_FILE)
    except ObjectNotFoundError:
        return None


def _undo(
    storage: Storage, old_files: list[str], committed: frozenset[str], intent: bytes | None
) -> None:
    """Leave the output as this run found it: a sample refused while writing (one pass
    over the bytes finds bad images only then) deletes the files this run wrote."""
    before = set(old_files) | committed | _CONTROL
    for path in list(storage.list()):
        if path not in before:
            storage.delete(path)
    storage.remove_leftovers()
    if intent is None:
        storage.delete(INTENT_FILE)
    else:
        storage.put(INTENT_FILE, intent)


def _read_intent(storage: Storage) -> dict[str, Any] | None:
    try:
        record = json.loads(storage.get(INTENT_FILE))
    except (ObjectNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _finish_committed(
    storage: Storage, mode: Mode, command: str, legacy: bool = False
) -> ExportConfig | None:
    """When an earlier run of this command (or any run, for ``resume``) was killed after
    its config.yaml committed, only its clean-up is left: do it and return its config.
    (``legacy``: an older shardex's interrupted promotion was just finished.)"""
    if not (legacy and mode == "resume"):
        intent = _read_intent(storage)
        if intent is None:
            return None
        now = _config_digest(storage)
        if now is None or now == intent.get("base"):
            return None  # it had not committed
        if mode != "resume" and (intent.get("command"), intent.get("mode")) != (command, mode):
            return None  # another command: it replaces or extends what is there
    config = read_config(storage)
    storage.remove_leftovers()
    ours = [p for p in storage.list() if _OURS.match(p)]
    _remove_stale(storage, ours, config)
    storage.delete(INTENT_FILE)
    return config


def _promote_legacy(storage: Storage) -> ExportConfig | None:
    """Repair the output of a shardex version that renamed ``.pending`` files after its
    config.yaml committed: a kill between the two left a config.yaml naming files already
    renamed. Commit a config.yaml naming the files that exist; None if nothing to do."""
    try:
        config = read_config(storage)
    except ShardexError:
        return None

    def usual(name: str) -> str:
        if ".pending." not in name or storage.exists(name):
            return name
        renamed = name.replace(".pending.", ".")
        return renamed if storage.exists(renamed) else name

    splits = {
        name: dataclasses.replace(
            info, index=IndexInfo(usual(info.index.samples), usual(info.index.keys))
        )
        if info.index is not None
        else info
        for name, info in config.splits.items()
    }
    metadata = usual(config.metadata_file) if config.metadata_file else None
    fixed = dataclasses.replace(config, splits=splits, metadata_file=metadata)
    if fixed == config:
        return None
    _commit(storage, fixed)
    return fixed


def _resumed(storage: Storage, opts: ExportOptions, command: str) -> ExportOptions:
    """``resume`` over a committed export finishes the overwrite or append that was
    killed before it committed (given the same source and options)."""
    intent = _read_intent(storage)
    if opts.mode != "resume" or intent is None or not storage.exists(CONFIG_FILE):
        return opts
    mode = intent.get("mode")
    if mode not in ("overwrite", "append"):
        return opts
    if intent.get("command") != command:
        raise OutputExistsError(
            f"output {storage.uri} holds a complete export and the files of an interrupted "
            f"--mode {mode} of another source or other options; resume that one with the "
            "same source and options, or pass --overwrite"
        )
    return dataclasses.replace(opts, mode=mode)


def _exported_keys(storage: Storage, previous: ExportConfig | None) -> frozenset[str]:
    if previous is None or not previous.metadata_file:
        return frozenset()
    table = read_checked_table(
        storage, previous.metadata_file, previous.metadata_checksum, columns=["key"]
    )
    return frozenset(table.column("key").to_pylist())


def _write_splits(
    storage: Storage,
    backend: Backend,
    prep: _Prepared,
    opts: ExportOptions,
    runner: Runner,
    bars: Progress,
    previous: ExportConfig | None,
    committed: frozenset[str] = frozenset(),
    skipped: list[dict[str, str]] | None = None,
) -> tuple[dict[str, SplitInfo], list[str], str, str | None]:
    """Write every selected split through the backend, streaming metadata.parquet; return
    the splits, their content digests, the metadata file's name and its checksum.

    When appending, the export's splits come first in their order, each followed by its
    new samples; its metadata rows are copied into the new metadata file. ``committed``:
    the files of the committed export, which no new file may replace. Samples skipped
    while writing are appended to ``skipped``.
    """
    table = prep.table
    names = [
        *(previous.splits if previous else ()),
        *(s for s in prep.splits if not previous or s not in previous.splits),
    ]
    bar = bars.task("writing shards", table.num_rows)
    metadata_file = unused_name(METADATA_FILE, committed)
    sink = _MetadataSink(storage, metadata_file)

    def on_shard(shard_table: pa.Table) -> None:
        try:
            sink(shard_table)
        except ValueError as exc:  # pyarrow: the schema differs from the rows before
            raise ExportError(f"the new samples' columns differ from the export's: {exc}") from exc
        bar.advance(shard_table.num_rows)

    def on_skip(records: list[dict[str, str]]) -> None:
        if skipped is not None:
            skipped.extend(records)
        bar.advance(len(records))

    old_meta = _old_metadata(storage, previous)
    written: dict[str, SplitInfo] = {}
    digests: list[str] = []
    splits = _split_rows(prep, names)
    try:
        for split, rows in zip(names, splits, strict=True):
            before = previous.splits.get(split) if previous else None
            if old_meta is not None and before is not None:
                sink(old_meta.filter(pc.equal(old_meta.column("split"), split)))
            count = rows.num_samples if isinstance(rows, SplitRows) else rows.num_rows
            if count == 0 and before is not None:
                written[split] = before
                continue
            plan, digest = _plan(rows, split, prep, opts, before, committed, previous)
            digests.append(digest)
            plan = dataclasses.replace(plan, on_skip=on_skip)
            info = backend.write_split(storage, plan, runner, on_shard)
            if info.num_samples or before is not None:
                written[split] = info
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    return written, digests, metadata_file, sink.checksum


def _split_rows(prep: _Prepared, names: list[str]) -> list[SplitRows | pa.Table]:
    """Each split's rows: candidates over the shared members (shard-by-shard backends;
    no sample bytes copied), or the split's whole table with ``sample_index``."""
    table = prep.table
    column = table.column("split")
    if prep.members is None:
        return [table.filter(pc.equal(column, s)) for s in names]
    meta = table.drop_columns([MEMBERS])
    values = column.to_numpy(zero_copy_only=False)
    out: list[SplitRows | pa.Table] = []
    for name in names:
        index = np.flatnonzero(values == name).astype(np.int64)
        rows = meta if len(index) == meta.num_rows else meta.take(pa.array(index))
        sizes = sample_sizes(rows, prep.members, index, with_label=prep.write_label)
        out.append(SplitRows(rows, prep.members, index, sizes))
    return out


def _plan(
    rows: SplitRows | pa.Table,
    split: str,
    prep: _Prepared,
    opts: ExportOptions,
    before: SplitInfo | None,
    committed: frozenset[str],
    previous: ExportConfig | None,
) -> tuple[SplitPlan, str]:
    """A split's plan, and its content digest."""
    start = before.num_samples if before is not None else 0
    if isinstance(rows, SplitRows):
        table, sizes, candidates = rows.rows, rows.sizes, rows
    else:
        table = rows.append_column(
            "sample_index", pa.array(np.arange(start, start + rows.num_rows))
        )
        sizes, candidates = sample_sizes_of_table(table, prep.write_label), None
    digest = content_digest(table, sizes)
    plan = SplitPlan(
        split,
        table,
        plan_bounds(sizes, opts.samples_per_shard, opts.max_shard_bytes),
        name_hash(opts, split, digest),
        prep.write_label,
        prep.fields,
        resume=opts.mode in ("resume", "overwrite", "append"),
        previous=before,
        existing=committed,
        format_version=previous.format_version if previous else FORMAT_VERSION,
        candidates=candidates,
        samples_per_shard=opts.samples_per_shard,
        max_shard_bytes=opts.max_shard_bytes,
        check=SampleCheck(opts.validate, opts.max_pixels, opts.on_error),
    )
    return plan, digest


def sample_sizes_of_table(rows: pa.Table, with_label: bool) -> npt.NDArray[np.int64]:
    """Planned tar sizes of a split's whole table (backends that write whole splits)."""
    members = Members.of(rows.column(MEMBERS))
    return sample_sizes(
        rows, members, np.arange(rows.num_rows, dtype=np.int64), with_label=with_label
    )


def _old_metadata(storage: Storage, previous: ExportConfig | None) -> pa.Table | None:
    if previous is None or not previous.metadata_file:
        return None
    return read_checked_table(storage, previous.metadata_file, previous.metadata_checksum)
