"""The public entry points for reading: open an export, read its contract."""

from __future__ import annotations

import os
from typing import Any

from shardex.backends.registry import backend_for
from shardex.contract import ExportConfig
from shardex.dataset import Dataset, OnReadError
from shardex.errors import ConfigError
from shardex.storage import Storage, open_storage


def read_config(
    location: str | os.PathLike[str] | Storage, storage_options: dict[str, Any] | None = None
) -> ExportConfig:
    """Read and validate the config.yaml of an export.

    Raises:
        NotAnExportError: there is no config.yaml.
        SchemaError: config.yaml does not match the schema.
    """
    return ExportConfig.read(open_storage(location, storage_options))


def resolve_split(config: ExportConfig, split: str | None, where: str) -> str:
    """The split to open: the one named, or the only one there is."""
    if split is not None:
        config.split(split)
        return split
    if len(config.splits) == 1:
        return next(iter(config.splits))
    raise ConfigError(
        f"{where} has several splits ({', '.join(config.splits)}); choose one with split="
    )


def open_dataset(
    location: str | os.PathLike[str] | Storage,
    split: str | None = None,
    *,
    decode: bool = False,
    verify: bool = True,
    on_error: OnReadError = "raise",
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Open one split of an export, whatever its backend.

    Args:
        location: the export's folder (or storage).
        split: which split; may be left out when the export has only one.
        decode: decode images to arrays, ``cls`` to int, ``json`` to objects (default:
            the exact stored bytes).
        verify: check each sample's checksum as it is read (docs/format.md, "Reading").
        on_error: ``"skip"``: iteration passes over damaged samples, recording
            ``(index, message)`` in ``dataset.skipped``; random access always raises.
        storage_options: options for remote storage.
    """
    storage = open_storage(location, storage_options)
    config = read_config(storage)
    name = resolve_split(config, split, storage.uri)
    return backend_for(config).open(
        storage, config, name, decode=decode, verify=verify, on_error=on_error
    )
