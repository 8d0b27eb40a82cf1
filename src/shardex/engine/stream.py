"""Pass 1 over a streaming source in memory that does not grow with the dataset: each
batch checked, split and spilled to scratch; repeated keys found across batches from hash
runs at the end. What needs every batch is applied as the spills are read back
(:mod:`shardex.engine.finish`), so rows match those of a check over every sample at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.checks import (
    check_repeated,
    check_splits,
    folded_hashes,
    key_problem,
    refuse,
    refuse_left_out,
    unsafe_keys,
)
from shardex.engine.spill import Spill, holds, memory_budget
from shardex.errors import EmptySourceError, SourceError
from shardex.format.runs import HashRuns
from shardex.image_member import one_image_member
from shardex.options import ExportOptions
from shardex.planning import assign_splits
from shardex.quoting import quoted
from shardex.refs.members import pin_inline
from shardex.refs.pinned import Pinned
from shardex.refs.scan import INVALID, MEMBERS, LeftOut, SampleStream, batch_types_error

#: The source row number of each spilled row (the order of samples).
ROW: Final = "_row"
_KEY_RECORD: Final = np.dtype([("h", "<u8"), ("row", "<i8")])


@dataclass(slots=True)
class _Lists:
    lengths: set[int] = field(default_factory=set)
    missing: int = 0


@dataclass(slots=True)
class Scanned:
    """What pass 1 found."""

    spills: dict[str, Spill]
    schema: pa.Schema
    lists: dict[str, _Lists]
    #: Source row numbers of every sample not exported (bad, repeated), sorted.
    dropped: np.ndarray
    #: Those of repeated keys (still in the spills: left out as they are read back).
    repeated: np.ndarray
    skipped: list[dict[str, str]]
    label_names: tuple[str, ...] | None
    with_label: bool
    split_method: str
    #: Samples per split (repeated keys not counted).
    counts: dict[str, int]
    #: Member names in the order first seen.
    exts: tuple[str, ...]
    #: Whether the rows' bytes are pinned (in this process); those pass 1 pinned.
    pin: bool = False
    pinned: tuple[Pinned, ...] = ()

    @property
    def num_rows(self) -> int:
        return sum(self.counts.values())

    @property
    def assigned(self) -> bool:
        return self.split_method != "source"


class _Pass:
    def __init__(
        self, opts: ExportOptions, folder: Path, taken: frozenset[str], remote: bool, pin: bool
    ) -> None:
        self.opts, self.folder, self.taken, self.pin = opts, folder, taken, pin
        self.pinned: list[Pinned] = []
        self.spills: dict[str, Spill] = {}
        self.memory = memory_budget(remote)
        self.schemas: list[pa.Schema] = []
        self.lists: dict[str, _Lists] = {}
        self.left_out: list[LeftOut] = []
        self.bad: list[tuple[int, dict[str, str]]] = []
        self.keys = HashRuns(folder, "keys", _KEY_RECORD, None if holds(remote) else 0)
        self.rows = 0
        self.with_label: bool | None = None
        self.source_split: bool | None = None
        self.exts: dict[str, None] = {}

    def add(self, table: pa.Table) -> None:
        table = one_image_member(table, self.opts.image_member)
        if self.pin:  # before any filter: rows then hold references only
            column, pinned = pin_inline(table.column(MEMBERS))
            if pinned is not None:
                self.pinned.append(pinned)
                table = table.set_column(table.column_names.index(MEMBERS), MEMBERS, column)
        first = self.rows
        self.rows += table.num_rows
        # labels seen in any batch are kept (null in batches without them)
        self.with_label = bool(self.with_label) or (
            self.opts.labels and "label" in table.column_names
        )
        table = self._split_column(table, first)
        self._list_stats(table)
        reasons: list[str | None] = [None] * table.num_rows
        if INVALID in table.column_names:
            reasons = [r or None for r in table.column(INVALID).to_pylist()]
            table = table.drop_columns([INVALID])
        if "label" in table.column_names and not self.opts.labels:
            table = table.drop_columns(["label"])
        self._schema(table.schema)
        keys = table.column("key").to_pylist()
        if "split" in table.column_names:
            check_splits(table.column("split").to_pylist(), keys, reasons)
        # each key found unsafe at once is asked why; all are when an append's (confirmed
        # at once) are taken
        if self.taken.isdisjoint(keys):
            ask = unsafe_keys(table.column("key"))
        else:
            ask = np.ones(len(keys), bool)
        for i in np.flatnonzero(ask).tolist():
            if reasons[i] is None:
                reasons[i] = key_problem(keys[i], self.taken)
        table, keys, rows = self._drop_bad(table, keys, reasons, first)
        self._add_keys(keys, rows)
        exts = pc.unique(pc.struct_field(pc.list_flatten(table.column(MEMBERS)), "ext"))
        self.exts.update(dict.fromkeys(exts.to_pylist()))
        if not self.source_split:
            table, _ = assign_splits(table, self.opts)
        self._spill(table.append_column(ROW, pa.array(rows, pa.int64())))

    def _split_column(self, table: pa.Table, first: int) -> pa.Table:
        """A null split column where the first batch had one; one appearing later is
        refused, as the samples before it were already given splits."""
        has = "split" in table.column_names
        if self.source_split is None:
            self.source_split = has
        elif self.source_split and not has:
            table = table.append_column("split", pa.nulls(table.num_rows, pa.string()))
        elif has and not self.source_split:
            key = table.column("key")[0].as_py() if table.num_rows else ""
            raise SourceError(
                f"the source names the split of sample {quoted(key)} (number {first}) and "
                "later ones but not of those before it; give every sample a split, or none "
                "(then the export assigns them)"
            )
        return table

    def _drop_bad(
        self, table: pa.Table, keys: list[str], reasons: list[str | None], first: int
    ) -> tuple[pa.Table, list[str], np.ndarray]:
        bad = [i for i, r in enumerate(reasons) if r is not None]
        if not bad:
            return table, keys, np.arange(first, first + table.num_rows, dtype=np.int64)
        originals = table.column("original_path")
        self.bad += [
            (first + i, {"key": keys[i], "original_path": originals[i].as_py(), "reason": str(r)})
            for i in bad
            if (r := reasons[i]) is not None
        ]
        keep = np.ones(table.num_rows, bool)
        keep[bad] = False
        kept = [k for k, r in zip(keys, reasons, strict=True) if r is None]
        return table.filter(pa.array(keep)), kept, np.flatnonzero(keep) + first

    def _schema(self, schema: pa.Schema) -> None:
        if not self.schemas or not schema.equals(self.schemas[-1]):
            self.schemas.append(schema)

    def _list_stats(self, table: pa.Table) -> None:
        """Lengths of list columns, and rows without a value (a missing column's count)."""
        for f in table.schema:
            if f.name != MEMBERS and (pa.types.is_list(f.type) or pa.types.is_large_list(f.type)):
                col = table.column(f.name)
                stats = self.lists.setdefault(f.name, _Lists(missing=self.rows - table.num_rows))
                lengths = pc.unique(pc.list_value_length(col)).to_pylist()
                stats.lengths.update(x for x in lengths if x is not None)
                stats.missing += col.null_count
        for name, stats in self.lists.items():
            if name not in table.column_names:
                stats.missing += table.num_rows

    def _add_keys(self, keys: list[str], rows: np.ndarray) -> None:
        records = np.empty(len(keys), _KEY_RECORD)
        records["h"] = folded_hashes(keys)
        records["row"] = rows
        self.keys.add(records)

    def _spill(self, table: pa.Table) -> None:
        splits = table.column("split")
        for name in pc.unique(splits).to_pylist():
            if name not in self.spills:
                file = f"split{len(self.spills):04d}"
                self.spills[name] = Spill(self.folder, file, self.memory)  # one budget
            self.spills[name].append(table.filter(pc.equal(splits, name)))

    def discard(self) -> None:
        self.keys.remove()
        for spill in self.spills.values():
            spill.remove()

    def repeated(self) -> tuple[np.ndarray, list[tuple[int, dict[str, str]]]]:
        """Rows whose key repeats an earlier one (also by case), with their records; only
        rows whose hashes repeat are read back and compared."""
        suspects = [
            run["row"][np.r_[same, False] | np.r_[False, same]]
            for run in self.keys.sorted_runs()
            if np.any(same := run["h"][1:] == run["h"][:-1])
        ]
        self.keys.remove()
        if not suspects:
            return np.zeros(0, np.int64), []
        rows = np.sort(np.concatenate(suspects))
        found = [
            t.select([ROW, "key", "original_path"]).filter(pc.is_in(t.column(ROW), pa.array(rows)))
            for spill in self.spills.values()
            for t in spill.tables()
        ]
        table = pa.concat_tables(found)
        table = table.take(pc.sort_indices(table, [(ROW, "ascending")]))
        keys = table.column("key").to_pylist()
        reasons: list[str | None] = [None] * len(keys)
        check_repeated(
            keys, list(range(len(keys))), reasons, table.column("original_path"), self.taken
        )
        numbers = table.column(ROW).to_numpy()
        originals = table.column("original_path").to_pylist()
        out = [
            (int(numbers[i]), {"key": keys[i], "original_path": originals[i], "reason": r})
            for i, r in enumerate(reasons)
            if r is not None
        ]
        return np.array([g for g, _ in out], np.int64), out


def scan_stream(
    stream: SampleStream,
    opts: ExportOptions,
    folder: Path,
    uri: str,
    taken: frozenset[str] = frozenset(),
    *,
    remote: bool = False,
    pin: bool = False,
) -> Scanned:
    """Pass 1 over ``stream``, refusing as a check of every sample at once would;
    ``pin``: inline bytes stay where the batches hold them (written in this process)."""
    work = _Pass(opts, folder, taken, remote, pin)
    try:
        return _scan(stream, opts, uri, work)
    except BaseException:
        work.discard()  # its files are open for appending: closed now, not by the GC
        raise


def _scan(stream: SampleStream, opts: ExportOptions, uri: str, work: _Pass) -> Scanned:
    batches = 0
    for batch in stream.batches:
        batches += 1
        work.left_out += batch.left_out
        if batch.table.num_rows:
            work.add(batch.table)
    if not batches:
        raise SourceError(f"source {quoted(uri)} yielded no batch of samples")
    repeated, records = work.repeated()
    bad = sorted(work.bad + records, key=lambda x: x[0])
    if work.left_out and opts.on_error == "error":
        refuse_left_out(work.left_out)
    if bad and opts.on_error == "error":
        refuse([r for _, r in bad])
    counts = _counts(work, repeated)
    if not sum(counts.values()):
        raise EmptySourceError(f"every sample of {uri} was skipped; nothing to export")
    if work.source_split and opts.split_fractions:
        assign_splits(pa.table({"split": pa.array([], pa.string())}), opts)  # its error
    method = "source" if work.source_split else "fractions" if opts.split_fractions else "single"
    return Scanned(
        spills=work.spills,
        schema=_joined(work.schemas, uri),
        lists=work.lists,
        dropped=np.sort(np.array([g for g, _ in bad], np.int64)),
        repeated=repeated,
        skipped=[x.record() for x in work.left_out] + [r for _, r in bad],
        label_names=stream.label_names if work.with_label else None,
        with_label=bool(work.with_label),
        split_method=method,
        counts=counts,
        exts=tuple(work.exts),
        pin=work.pin,
        pinned=tuple(work.pinned),
    )


def _joined(schemas: list[pa.Schema], uri: str) -> pa.Schema:
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        raise batch_types_error(uri, exc) from exc


def _counts(work: _Pass, repeated: np.ndarray) -> dict[str, int]:
    """Samples per split, repeated keys not counted (empty splits gone)."""
    counts = {name: spill.num_rows for name, spill in work.spills.items()}
    if len(repeated):
        for name, spill in work.spills.items():
            for t in spill.tables():
                counts[name] -= int(
                    pc.sum(pc.is_in(t.column(ROW), pa.array(repeated))).as_py() or 0
                )
    return {name: n for name, n in counts.items() if n}
