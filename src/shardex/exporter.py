"""``shardex.export``: the one entry point of an export (the engine is :mod:`shardex.engine`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from shardex.backends.ownership import INTENT_FILE
from shardex.contract import ExportConfig
from shardex.engine.commit import export_files
from shardex.engine.run import export_options, run_export
from shardex.errors import ConfigError
from shardex.options import ExportOptions, parse_split_fractions
from shardex.parallel import Runner
from shardex.sample_check import OnError
from shardex.sources import Source
from shardex.storage import Storage

__all__ = [
    "INTENT_FILE",
    "ExportOptions",
    "OnError",
    "export",
    "export_files",
    "parse_split_fractions",
]


def export(
    source: str | os.PathLike[str] | Source | Mapping[str, Any],
    output: str | os.PathLike[str] | Storage,
    options: ExportOptions | None = None,
    *,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_storage_options: dict[str, Any] | None = None,
    executor: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    **kwargs: Any,
) -> ExportConfig:
    """Export a dataset; returns the committed contract.

    Args:
        source: a path, table, tar glob, ``demo``, an existing export, a mapping of names
            to arrays, or a Source (see :func:`open_source`).
        output: the export's folder or URL (or a Storage).
        options: an ExportOptions, or its fields as keyword arguments
            (``samples_per_shard=500``, ``mode="resume"`` ...).
        progress: show progress bars.
        storage_options: options for object storage (see docs/storage.md).
        source_storage_options: a remote source's own options (default:
            ``storage_options``).
        executor: ``"local"`` processes, or ``"ray"`` tasks on the cluster at
            ``ray_address`` (``workers`` caps the tasks at once); a Ray this call started
            is shut down when it ends. The output is byte-identical either way.
        ray_address: the Ray cluster (``host:port``, ``ray://host:port``, ``auto``).

    Raises:
        OutputExistsError: the output holds an export (or an unfinished one) and ``mode``
            does not allow replacing or resuming it.
        BadSampleError: a sample is corrupt (and ``on_error`` is ``"error"``).
        SourceError: the source is missing, empty or malformed.
    """
    opts = export_options(options, kwargs)
    with _runner(executor, ray_address, opts.workers) as runner:
        return run_export(
            source,
            output,
            opts,
            progress=progress,
            storage_options=storage_options,
            source_storage_options=source_storage_options,
            runner=runner,
        )


@contextmanager
def _runner(
    executor: Literal["local", "ray"], ray_address: str | None, workers: int | None
) -> Iterator[Runner | None]:
    """``None`` (local processes), or Ray tasks on a cluster this call joins and leaves."""
    if executor not in ("local", "ray"):
        raise ConfigError(f"executor must be 'local' or 'ray', got {executor!r}")
    if executor == "local":
        yield None
        return
    from shardex.pipeline.ray_executor import RayExecutor, RayRunner

    cluster = RayExecutor(ray_address)
    runner = RayRunner(cluster, limit=workers)
    try:
        yield runner
    finally:
        cluster.close()  # a Ray this call started
