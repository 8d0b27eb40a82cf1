"""The planning pass of an export: each split's spilled rows read back and made final (the
types joined over every batch, options applied), sized by the backend and written to a
final spill; field specs, member names and the label range gathered on the way, one batch
at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.backends.base import Backend
from shardex.checks import json_columns, json_texts
from shardex.engine.spill import FinalSpill, memory_budget
from shardex.engine.stream import ROW, Scanned
from shardex.fields import FieldMerger, add_members, cast_members, column_members
from shardex.image_member import IMAGE_FORMAT
from shardex.planning import drop_members
from shardex.refs.members import JSON_COLUMN, Members
from shardex.refs.rows import SpilledRows
from shardex.refs.scan import MEMBERS


@dataclass(frozen=True, slots=True)
class Finished:
    """The selected splits' final spills, and what the contract needs."""

    spilled: dict[str, SpilledRows]
    schema: pa.Schema
    merger: FieldMerger
    exts: frozenset[str]
    label_max: int | None
    image_formats: tuple[str, ...] | None = None


class _Final:
    """Makes spilled rows final; ``start``: the export number of the first sample."""

    def __init__(
        self,
        scanned: Scanned,
        start: int,
        dropped: frozenset[str] = frozenset(),
        labels: pa.Array | None = None,
        dtype: str | None = None,
        as_fields: tuple[str, ...] = (),
    ) -> None:
        self.s, self.start = scanned, start
        self.dropped, self.labels, self.dtype = dropped, labels, dtype
        self.as_fields = as_fields
        self.formats: dict[str, int] | None = None
        schema = scanned.schema
        self.casts: dict[str, pa.DataType] = {}
        for f in schema:
            t = f.type
            if f.name == MEMBERS:
                continue
            if pa.types.is_list(t) or pa.types.is_large_list(t):
                stats = scanned.lists.get(f.name)
                lengths = stats.lengths if stats is not None else set()
                one = next(iter(lengths)) if len(lengths) == 1 else 0
                fixed = one and stats is not None and not stats.missing
                # Parquet reads no fixed-size lists of size 0 back
                self.casts[f.name] = (
                    pa.list_(t.value_type, one) if fixed else pa.list_(t.value_type)
                )
            elif pa.types.is_fixed_size_list(t):
                self.casts[f.name] = pa.list_(t.value_type, t.list_size)
        for name, t in self.casts.items():
            schema = schema.set(schema.get_field_index(name), pa.field(name, t))
        self.json = json_columns(schema)
        self.repeated = pa.array(scanned.repeated, pa.int64())

    def __call__(self, raw: pa.Table) -> pa.Table:
        s = self.s
        if len(self.repeated):
            raw = raw.filter(pc.invert(pc.is_in(raw.column(ROW), self.repeated)))
        rows = raw.column(ROW).to_numpy()
        split = raw.column("split")
        base = raw.drop_columns([ROW, "split"] if s.assigned else [ROW])
        if not base.schema.equals(s.schema):
            empty = s.schema.empty_table()
            base = pa.concat_tables([empty, base], promote_options="permissive").combine_chunks()
        for name, t in self.casts.items():
            i = base.schema.get_field_index(name)
            base = base.set_column(i, name, base.column(i).cast(t))
        if self.json:
            base = base.append_column(JSON_COLUMN, json_texts(base.select(list(self.json))))
        if s.assigned:
            base = base.append_column("split", split)
        if self.dropped:
            base = drop_members(base, self.dropped)
        if self.as_fields:
            base = add_members(base, [column_members(base.column(k), k) for k in self.as_fields])
        if self.dtype is not None:
            base = cast_members(base, self.dtype)
        if self.labels is not None and "label" in base.column_names:
            at = base.column_names.index("label")
            base = base.set_column(at, "label", pc.take(self.labels, base.column(at)))
        if IMAGE_FORMAT in base.column_names:
            self._formats(base.column(IMAGE_FORMAT), rows)
        numbers = self.start + rows - np.searchsorted(s.dropped, rows)
        return base.append_column("export_index", pa.array(numbers, pa.int64()))

    def _formats(self, column: pa.ChunkedArray, rows: np.ndarray) -> None:
        """Each format with the first source row that has it (source order across splits)."""
        formats = self.formats = self.formats if self.formats is not None else {}
        for name in pc.unique(column).to_pylist():
            if name:
                row = int(rows[pc.index(column, name).as_py()])
                formats[name] = min(formats.get(name, row), row)


def finish(
    scanned: Scanned,
    backend: Backend,
    folder: Path,
    selected: list[str],
    *,
    write_label: bool,
    start: int = 0,
    dropped: frozenset[str] = frozenset(),
    labels: pa.Array | None = None,
    dtype: str | None = None,
    as_fields: tuple[str, ...] = (),
    put: Callable[[bytes], Any] | None = None,
) -> Finished:
    """Read every split back once; only ``selected`` ones are spilled again and sized.
    ``dropped``: member names not stored; ``labels``: an append's label renumbering;
    ``as_fields``: metadata columns also stored as fields; ``put``: see :class:`FinalSpill`."""
    final = _Final(scanned, start, dropped, labels, dtype, as_fields)
    budget = memory_budget(put is not None)
    merger = FieldMerger()
    exts: set[str] = set()
    top: int | None = None
    schema: pa.Schema | None = None
    spilled: dict[str, SpilledRows] = {}
    for k, (name, spill) in enumerate(scanned.spills.items()):
        if name not in scanned.counts:
            continue
        out: FinalSpill | None = None
        for raw in spill.tables():
            rows = final(raw)
            if not rows.num_rows:
                continue
            schema = rows.schema
            members = Members.of(rows.column(MEMBERS))
            merger.add(rows, members)
            exts.update(members.ext_names[c] for c in np.unique(members.ext_codes).tolist())
            if scanned.with_label:
                most = pc.max(rows.column("label")).as_py()
                top = most if top is None or (most is not None and most > top) else top
            if name in selected:
                every = np.arange(rows.num_rows, dtype=np.int64)
                sizes = backend.sample_sizes(rows, members, every, with_label=write_label)
                out = out or FinalSpill(folder, f"final{k:04d}", rows.schema, put, budget)
                out.append(rows, sizes)
        spill.remove()
        if out is not None:  # pinned bytes: written in this process
            spilled[name] = dataclasses.replace(out.close(), pinned=scanned.pin)
    assert schema is not None  # scan_stream refused an export of no sample
    formats = final.formats
    order = tuple(sorted(formats, key=formats.__getitem__)) if formats is not None else None
    return Finished(spilled, schema, merger, frozenset(exts), top, order)
