"""Pass 1 of an export: the source's sample references checked, split, labelled and
their keys selected, without reading image bytes (the shard writer checks those).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from shardex.backends.base import Backend
from shardex.bfloat16 import BFLOAT16, mark
from shardex.contract import LABEL_PREFIX, ExportConfig, FieldSpec
from shardex.engine.finish import finish
from shardex.engine.stream import scan_stream
from shardex.engine.taken import TakenKeys
from shardex.errors import ConfigError
from shardex.fields import with_columns
from shardex.format.tables import check_local_file, metadata_errors
from shardex.options import ExportOptions
from shardex.planning import (
    member_keys_of,
    ordered_splits,
    select_keys,
    unselected_members,
)
from shardex.progress import Progress
from shardex.refs.members import JSON_COLUMN
from shardex.refs.pinned import Pinned
from shardex.refs.rows import SpilledRows
from shardex.refs.scan import MEMBERS, SampleStream
from shardex.storage import Storage


@dataclass(frozen=True, slots=True)
class Prepared:
    """The checked, split samples and the decisions made about them: each split's rows
    ``spilled`` to local scratch (or a remote runner's object store)."""

    fields: tuple[FieldSpec, ...]
    skipped: list[dict[str, str]]
    split_method: str
    splits: list[str]
    x_keys: tuple[str, ...]
    y_keys: tuple[str, ...]
    with_label: bool
    write_label: bool
    label_names: tuple[str, ...] | None
    schema: pa.Schema
    num_rows: int
    label_max: int | None
    #: Logical key -> member names of the samples (see :func:`member_keys_of`).
    stored: dict[str, set[str]]
    spilled: dict[str, SpilledRows]
    #: The images' real encodings when one member name holds them all (``image_member``).
    image_formats: tuple[str, ...] | None = None
    #: The batches' bytes the rows point into (kept while they are written).
    pinned: tuple[Pinned, ...] = ()

    def in_memory(self) -> bool:
        """Whether the bytes are in this process (then written here)."""
        return any(rows.inline() for rows in self.spilled.values())


@dataclass(frozen=True, slots=True)
class _Keys:
    """The x and y keys, the metadata columns stored as fields, and whether the label is."""

    x: tuple[str, ...]
    y: tuple[str, ...]
    as_fields: tuple[str, ...]
    write_label: bool

    @classmethod
    def of(
        cls, opts: ExportOptions, members: Iterable[str], with_label: bool, columns: Iterable[str]
    ) -> _Keys:
        seen = list(members)
        internal = {MEMBERS, JSON_COLUMN, "key", "original_path", "split", "label", "export_index"}
        available = [
            *seen,
            *(["label"] if with_label else []),
            *[c for c in columns if c not in internal],
        ]
        x, y = select_keys(opts, available, seen, with_label)
        as_fields = tuple(k for k in (*x, *y) if k not in seen and k != "label")
        return cls(x, y, as_fields, with_label and "label" in (*x, *y))

    def fields(
        self, fields: tuple[FieldSpec, ...], opts: ExportOptions, previous: ExportConfig | None
    ) -> tuple[FieldSpec, ...]:
        """The field specs as config.yaml records them."""
        prefix = previous.label_prefix if previous is not None else LABEL_PREFIX
        return with_columns(mark(fields) if opts.dtype == BFLOAT16 else fields, self.y, prefix)


def prepare_streamed(
    stream: SampleStream,
    uri: str,
    opts: ExportOptions,
    backend: Backend,
    folder: Path,
    bars: Progress,
    taken: frozenset[str] = frozenset(),
    previous: ExportConfig | None = None,
    put: Callable[[bytes], Any] | None = None,
    pin: bool = False,
) -> Prepared:
    """Pass 1 over a stream, then the planning pass; the splits' rows end in spill files
    under ``folder``, or in a remote runner's object store (``put``). ``pin``: the bytes
    are in memory: left there, and written in this process."""
    scanning = bars.task(f"scanning {uri}", None)
    scanned = scan_stream(stream, opts, folder, uri, taken, remote=put is not None, pin=pin)
    scanning.done()
    splits = ordered_splits(set(scanned.counts), opts)
    with_label = scanned.with_label
    seen = member_keys_of(scanned.exts)
    keys = _Keys.of(opts, seen, with_label, scanned.schema.names)
    label_names = scanned.label_names
    labels = None
    if previous is not None and with_label:
        label_names, labels = label_mapping(label_names, previous)
    done = finish(
        scanned,
        backend,
        folder,
        splits,
        write_label=keys.write_label,
        start=previous.num_samples if previous is not None else 0,
        dropped=unselected_members(seen, keys.x, keys.y),
        labels=labels,
        dtype=opts.dtype if opts.dtype not in (None, BFLOAT16) else None,  # bfloat16: later
        as_fields=keys.as_fields,
        put=put,
    )
    fields = done.merger.specs(keys.write_label, order=scanned.exts)
    return Prepared(
        fields=keys.fields(fields, opts, previous),
        skipped=scanned.skipped,
        split_method=previous.split_method if previous is not None else scanned.split_method,
        splits=splits,
        x_keys=keys.x,
        y_keys=keys.y,
        with_label=with_label,
        write_label=keys.write_label,
        label_names=label_names,
        schema=done.schema,
        num_rows=scanned.num_rows,
        label_max=done.label_max,
        stored=member_keys_of(done.exts),
        spilled=done.spilled,
        image_formats=done.image_formats if opts.image_member else None,
        pinned=scanned.pinned,
    )


def appending_options(opts: ExportOptions, previous: ExportConfig) -> ExportOptions:
    """New samples are split the way the export was, and keep its keys."""
    fractions = previous.split_method == "fractions"
    return dataclasses.replace(
        opts,
        split_fractions=previous.split_fractions if fractions else None,
        seed=(previous.split_seed or 0) if fractions else opts.seed,
        x_keys=previous.x_keys,
        y_keys=previous.y_keys,
        image_member=previous.shard_options.get("image_member"),
        layout="flat" if previous.flat else "split",
    )


def label_mapping(
    names: tuple[str, ...] | None, previous: ExportConfig
) -> tuple[tuple[str, ...] | None, pa.Array | None]:
    """An append's label names, and the export's number for each new label (None: same)."""
    if not (names and previous.label_names) or names == previous.label_names:
        return previous.label_names or names, None
    number = {name: i for i, name in enumerate(previous.label_names)}
    unknown = sorted(set(names) - set(number))
    if unknown:
        raise ConfigError(
            f"appended samples have labels the export does not know: {', '.join(unknown)} "
            f"(its labels: {', '.join(previous.label_names)})"
        )
    return previous.label_names, pa.array([number[name] for name in names], pa.int64())


def exported_keys(storage: Storage, previous: ExportConfig | None, folder: Path) -> frozenset[str]:
    """The keys of the export appended to, as hashes, from its checked metadata.parquet."""
    if previous is None or not previous.metadata_file:
        return frozenset()
    name, where = previous.metadata_file, storage.join(previous.metadata_file)
    path = storage.local_path(name)
    if path is None:
        path = folder / "exported-metadata.parquet"
        with open(path, "wb") as f:
            for chunk in storage.iter_chunks(name):
                f.write(chunk)
    with metadata_errors(where):
        check_local_file(Path(path), previous.metadata_checksum, where)
        return TakenKeys(Path(path))
