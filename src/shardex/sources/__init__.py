"""Sources: where samples come from. :func:`open_source` turns user input into a Source,
the first whose probe takes it (see :mod:`shardex.sources.registry`)."""

from __future__ import annotations

from shardex.refs.scan import SampleStream, ScanBatch, ScanResult, build_table, file_member
from shardex.sources.arrays import ArraySource
from shardex.sources.base import Source
from shardex.sources.demo import DemoSource
from shardex.sources.export import ExportSource
from shardex.sources.folder import FolderSource
from shardex.sources.probe import SourceSpec
from shardex.sources.registry import open_source, register_source
from shardex.sources.table import TableSource
from shardex.sources.tars import TarSource

__all__ = [
    "ArraySource",
    "DemoSource",
    "ExportSource",
    "FolderSource",
    "SampleStream",
    "ScanBatch",
    "ScanResult",
    "Source",
    "SourceSpec",
    "TableSource",
    "TarSource",
    "build_table",
    "file_member",
    "open_source",
    "register_source",
]
