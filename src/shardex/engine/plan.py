"""A split's plan: its candidates, their exact sizes in a shard and its name hash."""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import pyarrow as pa

from shardex.backends.base import Backend, SplitPlan
from shardex.contract import FORMAT_VERSION, ExportConfig, SplitInfo
from shardex.engine.prepare import Prepared
from shardex.options import ExportOptions
from shardex.planning import content_digest, name_hash
from shardex.refs.rows import SpilledRows, SplitRows
from shardex.refs.scan import MEMBER_TYPE, MEMBERS
from shardex.sample_check import SampleCheck

Rows: TypeAlias = SplitRows | SpilledRows


def split_rows(prep: Prepared, names: list[str], backend: Backend) -> list[Rows]:
    """Each split's rows, sized by the backend (no sample bytes copied), or spilled."""
    if prep.spilled is not None:  # a split of an append without new samples: none
        empty = pa.table({MEMBERS: pa.array([], pa.list_(MEMBER_TYPE))})
        return [prep.spilled.get(s, empty) for s in names]
    table, members = prep.table, prep.members
    assert table is not None  # not spilled: the whole table
    assert members is not None
    column = table.column("split")
    meta = table.drop_columns([MEMBERS])
    values = column.to_numpy(zero_copy_only=False)
    out: list[Rows] = []
    for name in names:
        index = np.flatnonzero(values == name).astype(np.int64)
        rows = meta if len(index) == meta.num_rows else meta.take(pa.array(index))
        sizes = backend.sample_sizes(rows, members, index, with_label=prep.write_label)
        out.append(SplitRows(rows, members, index, sizes))
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
    if isinstance(rows, SpilledRows):
        digest = rows.digest
    else:
        digest = content_digest(rows.rows, np.asarray(rows.sizes))
    plan = SplitPlan(
        split,
        rows,
        name_hash(opts, split, digest),
        prep.write_label,
        prep.fields,
        resume=opts.mode in ("resume", "overwrite", "append"),
        previous=before,
        existing=committed,
        format_version=previous.format_version if previous else FORMAT_VERSION,
        samples_per_shard=opts.samples_per_shard,
        max_shard_bytes=opts.max_shard_bytes,
        check=SampleCheck(opts.validate, opts.max_pixels, opts.on_error),
        flat=opts.layout == "flat",
    )
    return plan, digest
