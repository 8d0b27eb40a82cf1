"""A split's plan: its candidates, their exact sizes in a shard and its name hash."""

from __future__ import annotations

from shardex.backends.base import Backend, SplitPlan
from shardex.contract import FORMAT_VERSION, ExportConfig, SplitInfo
from shardex.engine.prepare import Prepared
from shardex.options import ExportOptions
from shardex.planning import name_hash
from shardex.refs.rows import SpilledRows
from shardex.sample_check import SampleCheck


def plan_split(
    rows: SpilledRows,
    split: str,
    backend: Backend,
    prep: Prepared,
    opts: ExportOptions,
    before: SplitInfo | None,
    committed: frozenset[str],
    previous: ExportConfig | None,
) -> tuple[SplitPlan, str]:
    """A split's plan, and its content digest."""
    digest = rows.digest
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
