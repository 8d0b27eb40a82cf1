"""shardex: export curated ML datasets to sharded storage and read them back fast.

Importing shardex loads only what opening an export needs; the rest of the API loads on
first use, and torch, ray, zarr and tensordict only in the modules that use them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardex.api import open_dataset, read_config

# The default backend's reader loads with the package: open_dataset then imports no more.
from shardex.backends import webdataset as _default_backend  # noqa: F401

# Imported now, as the package shares the function's name: a later import of
# shardex.browse.app must not replace it.
from shardex.browse import browse
from shardex.version import __version__

if TYPE_CHECKING:
    from shardex.backends.registry import get_backend, register_backend
    from shardex.contract import ExportConfig, KeySpec, ShardInfo, SplitInfo
    from shardex.dataset import Dataset
    from shardex.exported import ExportedDataset
    from shardex.exporter import ExportOptions, export
    from shardex.sources import open_source
    from shardex.storage import open_storage
    from shardex.verification import VerifyReport, verify

#: Public names imported on first use (PEP 562), by module.
_LAZY: dict[str, str] = {
    "get_backend": "shardex.backends.registry",
    "register_backend": "shardex.backends.registry",
    "ExportConfig": "shardex.contract",
    "KeySpec": "shardex.contract",
    "ShardInfo": "shardex.contract",
    "SplitInfo": "shardex.contract",
    "Dataset": "shardex.dataset",
    "ExportedDataset": "shardex.exported",
    "ExportOptions": "shardex.exporter",
    "export": "shardex.exporter",
    "open_source": "shardex.sources",
    "open_storage": "shardex.storage",
    "VerifyReport": "shardex.verification",
    "verify": "shardex.verification",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardex' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def materialize(spec: Any, output: Any = None, **kwargs: Any) -> ExportConfig:
    """The export a spec file describes (:func:`shardex.pipeline.spec.materialize`)."""
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
