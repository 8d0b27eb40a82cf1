"""A split's plan: its candidates over the shared members, their exact sizes in a shard
(the backend's :meth:`~shardex.backends.base.Backend.sample_sizes`), the first guess of
its shard boundaries and its deterministic name hash.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.backends.base import Backend, SplitPlan
from shardex.contract import (
    FORMAT_VERSION,
    ExportConfig,
    SplitInfo,
)
from shardex.engine.prepare import Prepared
from shardex.options import ExportOptions
from shardex.planning import (
    content_digest,
    name_hash,
    plan_bounds,
)
from shardex.rows import Members, Sizes, SpilledRows, SplitRows
from shardex.sample_check import SampleCheck
from shardex.sources.base import MEMBER_TYPE, MEMBERS

#: A split's rows as pass 2 gets them (see :func:`split_rows`).
Rows: TypeAlias = SplitRows | SpilledRows | pa.Table


_NO_ROWS = pa.table({"key": pa.nulls(0, pa.string())})  # (pa.array would import pandas)


def split_rows(prep: Prepared, names: list[str], backend: Backend) -> list[Rows]:
    """Each split's rows: candidates over the shared members, sized by the backend
    (shard-by-shard backends; no sample bytes copied), in spill files (a streamed pass 1:
    sized already), or the split's whole table."""
    if prep.spilled is not None:  # a split of an append without new samples: none
        empty = pa.table({MEMBERS: pa.array([], pa.list_(MEMBER_TYPE))})
        return [prep.spilled.get(s, empty) for s in names]
    table = prep.table
    assert table is not None  # not spilled: the whole table
    column = table.column("split")
    if prep.members is None:
        return [table.filter(pc.equal(column, s)) for s in names]
    meta = table.drop_columns([MEMBERS])
    values = column.to_numpy(zero_copy_only=False)
    out: list[Rows] = []
    for name in names:
        index = np.flatnonzero(values == name).astype(np.int64)
        rows = meta if len(index) == meta.num_rows else meta.take(pa.array(index))
        sizes = backend.sample_sizes(rows, prep.members, index, with_label=prep.write_label)
        out.append(SplitRows(rows, prep.members, index, sizes))
    return out


def plan_split(
    rows: Rows,
    split: str,
    backend: Backend,
    prep: Prepared,
    opts: ExportOptions,
    before: SplitInfo | None,
    committed: frozenset[str],
    previous: ExportConfig | None,
) -> tuple[SplitPlan, str]:
    """A split's plan, and its content digest."""
    start = before.num_samples if before is not None else 0
    digest: str | None = None
    candidates: SplitRows | SpilledRows | None
    sizes: Sizes
    if isinstance(rows, SpilledRows):
        table, sizes, candidates, digest = _NO_ROWS, rows.sizes, rows, rows.digest
    elif isinstance(rows, SplitRows):
        table, sizes, candidates = rows.rows, rows.sizes, rows
    else:
        table = rows.append_column(
            "sample_index", pa.array(np.arange(start, start + rows.num_rows))
        )
        members = Members.of(table.column(MEMBERS))
        every = np.arange(table.num_rows, dtype=np.int64)
        sizes = backend.sample_sizes(table, members, every, with_label=prep.write_label)
        candidates = None
    digest = digest or content_digest(table, np.asarray(sizes))
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
        flat=opts.layout == "flat",
    )
    return plan, digest
