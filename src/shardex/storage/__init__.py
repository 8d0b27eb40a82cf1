"""Storage: one interface for local directories and (later) object stores.

:func:`open_storage` is the single place where user input (a str, a Path, a URL or a
storage object) becomes a :class:`Storage`; inner code only ever sees a Storage.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from shardex.errors import ConfigError
from shardex.storage.base import ObjectWriter, RangeReader, Storage, checked_path
from shardex.storage.local import LocalStorage
from shardex.storage.options import SCHEMES, refuse_credentials_in_url

if TYPE_CHECKING:
    from shardex.storage.object import ObjectStorage

__all__ = [
    "LocalStorage",
    "ObjectStorage",
    "ObjectWriter",
    "RangeReader",
    "Storage",
    "checked_path",
    "open_storage",
]


def open_storage(
    location: str | os.PathLike[str] | Storage,
    storage_options: dict[str, Any] | None = None,
) -> Storage:
    """Return the storage for a location: a local path, ``file://``, object-store or
    ``memory://`` URL.

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
    if text.startswith("memory://"):
        from shardex.storage.memory import MemoryStorage

        return MemoryStorage(text, storage_options)
    if text.startswith(SCHEMES):
        from shardex.storage.object import ObjectStorage

        refuse_credentials_in_url(text)

        return ObjectStorage(text, storage_options)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise ConfigError(
            f"{text!r}: unknown scheme {scheme}:// (use a local path, file://, "
            f"{', '.join(SCHEMES)}, memory://)"
        )
    return LocalStorage(text)


def __getattr__(name: str) -> Any:
    # ObjectStorage on first use (PEP 562): opening a local export does not import the
    # object-storage modules (obstore's wrappers, the helper process: ~15 ms)
    if name == "ObjectStorage":
        from shardex.storage.object import ObjectStorage

        return ObjectStorage
    raise AttributeError(f"module 'shardex.storage' has no attribute {name!r}")
