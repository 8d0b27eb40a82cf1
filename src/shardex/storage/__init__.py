"""Storage: one interface for local directories and (later) object stores.

:func:`open_storage` is the single place where user input (a str, a Path, a URL or a
storage object) becomes a :class:`Storage`; inner code only ever sees a Storage.
"""

from __future__ import annotations

import os
from typing import Any

from shardex.errors import ConfigError
from shardex.storage.base import ObjectWriter, RangeReader, Storage
from shardex.storage.local import LocalStorage

__all__ = ["LocalStorage", "ObjectWriter", "RangeReader", "Storage", "open_storage"]

_REMOTE_SCHEMES = ("s3://", "gs://", "az://", "abfs://", "http://", "https://")


def open_storage(
    location: str | os.PathLike[str] | Storage,
    storage_options: dict[str, Any] | None = None,
) -> Storage:
    """Return the storage for a location: a local path, ``file://`` URL or Storage.

    Args:
        location: where the objects live.
        storage_options: options for remote stores (endpoint, region, profile).

    Raises:
        ConfigError: the scheme is not supported by this install.
    """
    if isinstance(location, Storage):
        return location
    text = os.fspath(location)
    if text.startswith("file://"):
        return LocalStorage(text[len("file://") :])
    if text.startswith(_REMOTE_SCHEMES):
        scheme = text.split("://", 1)[0]
        raise ConfigError(
            f"{text!r}: the {scheme}:// scheme is not supported by this version of shardex; "
            "export to a local directory"
        )
    del storage_options  # used by remote stores only
    return LocalStorage(text)
