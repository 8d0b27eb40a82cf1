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
        NotAnExportError: there is no config.yaml (nothing exported, or an export that is
            still being written or was interrupted).
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
        decode: decode images to numpy arrays, ``cls`` to int, ``json`` to objects;
            with False (default) every field is the exact stored bytes.
        verify: check each sample's checksum (and its index-members row) as it is read;
            False trusts them: a row is then only kept from pointing outside its sample
            (see docs/format.md, "Reading").
        on_error: ``"skip"`` makes iteration pass over damaged samples (checksum or tar
            errors), recording ``(index, message)`` in ``dataset.skipped``; random access
            always raises.
        storage_options: options for remote storage.

    Returns:
        A :class:`~shardex.dataset.Dataset`: ``len``, ``ds[i]``, ``ds.get(key)``,
        ``ds.get_many(indices)``, iteration, ``ds.metadata``, ``ds.config``.
    """
    storage = open_storage(location, storage_options)
    config = read_config(storage)
    name = resolve_split(config, split, storage.uri)
    return backend_for(config).open(
        storage, config, name, decode=decode, verify=verify, on_error=on_error
    )
