"""shardex: export curated ML datasets to sharded storage and read them back fast.

Importing shardex is light: torch, ray, zarr and tensordict are imported only by the
modules that use them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from shardex.api import open_dataset, read_config
from shardex.backends.registry import get_backend, register_backend
from shardex.browse import browse  # the function; the package stays shardex.browse in imports
from shardex.contract import ExportConfig, KeySpec, ShardInfo, SplitInfo
from shardex.dataset import Dataset
from shardex.exported import ExportedDataset
from shardex.exporter import ExportOptions, export
from shardex.sources import open_source
from shardex.storage import open_storage
from shardex.verification import VerifyReport, verify


def materialize(spec: Any, output: Any = None, **kwargs: Any) -> ExportConfig:
    """The export a spec file describes: reused when its fingerprint matches, else built
    (see :func:`shardex.pipeline.spec.materialize`)."""
    from shardex.pipeline.spec import materialize as _materialize

    return _materialize(spec, output, **kwargs)


__all__ = [
    "Dataset",
    "ExportConfig",
    "ExportOptions",
    "ExportedDataset",
    "KeySpec",
    "ShardInfo",
    "SplitInfo",
    "VerifyReport",
    "__version__",
    "browse",
    "export",
    "get_backend",
    "materialize",
    "open_dataset",
    "open_source",
    "open_storage",
    "read_config",
    "register_backend",
    "verify",
]
