"""Errors raised by shardex.

Every error subclasses :class:`ShardexError` and the nearest builtin exception, so callers
can catch either. Third-party errors are mapped once, where they enter (``raise ... from``)::

    ShardexError(Exception)
    ├── ConfigError(ShardexError, ValueError)            bad options or a bad config.yaml
    │   └── SchemaError(ConfigError)                     config.yaml does not match the schema
    ├── SourceError(ShardexError, ValueError)            a source cannot be read as asked
    │   ├── SourceNotFoundError(SourceError, FileNotFoundError)
    │   ├── EmptySourceError(SourceError)
    │   ├── DuplicateKeyError(SourceError)
    │   └── BadSampleError(SourceError)                  one sample is corrupt / not an image
    ├── ExportError(ShardexError, RuntimeError)          an export cannot be written
    │   ├── OutputExistsError(ExportError, FileExistsError)
    │   ├── OutputLockedError(ExportError)              another export is writing the output
    │   └── UnverifiedOutputError(ExportError)          a written file is missing or resized at
    │                                                    the commit (nothing is committed)
    ├── NotAnExportError(ShardexError, FileNotFoundError) no committed config.yaml
    ├── ExportReplacedError(ShardexError, RuntimeError)  the export changed since it was opened
    ├── ClusterUnreachableError(ShardexError, ConnectionError)  no Ray cluster answers at
    │                                                    the address given
    ├── StorageError(ShardexError, OSError)              a storage operation failed
    │   ├── ObjectNotFoundError(StorageError, FileNotFoundError)
    │   └── BucketNotFoundError(StorageError, FileNotFoundError)  the bucket itself is missing
    ├── FormatError(ShardexError, ValueError)            shard / index bytes are malformed
    │   └── ChecksumError(FormatError)                   bytes read do not match the checksum
    ├── SampleNotFoundError(ShardexError, KeyError)      no sample with that key
    └── BackendError(ShardexError, LookupError)          unknown / unavailable / duplicate backend
        └── MissingDependencyError(BackendError, ImportError)

Warnings::

    ShardexWarning(UserWarning)
    ├── ParallelismWarning(ShardexWarning)               work ran in one process, not workers
    └── RefetchWarning(ShardexWarning)                   source bytes read once are fetched again
"""

from __future__ import annotations

import importlib
from typing import Any


def mode_hint(mode: str) -> str:
    """How to ask for an export mode in a message that command-line and Python users
    both read: ``--mode resume (mode='resume' in Python)``."""
    flag = "--overwrite" if mode == "overwrite" else f"--mode {mode}"
    return f"{flag} ({'overwrite=True' if mode == 'overwrite' else f'mode={mode!r}'} in Python)"


class ShardexError(Exception):
    """Base class of every error shardex raises."""


class ConfigError(ShardexError, ValueError):
    """Options or a config.yaml are invalid."""


class SchemaError(ConfigError):
    """A config.yaml does not match the shipped JSON schema."""


class SourceError(ShardexError, ValueError):
    """A source cannot be read as requested."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The source path, table or glob does not exist."""


class EmptySourceError(SourceError):
    """The source holds no samples."""


class DuplicateKeyError(SourceError):
    """Two samples of a source have the same key."""


class BadSampleError(SourceError):
    """A sample is corrupt, empty, or not the kind of file its name says."""

    def __init__(self, message: str, *, path: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class ExportError(ShardexError, RuntimeError):
    """An export cannot be written."""


class OutputExistsError(ExportError, FileExistsError):
    """The output already holds an export (or its leftovers) and overwrite was not asked."""


class OutputLockedError(ExportError):
    """Another export holds the output's lock (it is writing there now)."""


class UnverifiedOutputError(ExportError):
    """Just before the commit, a file the export wrote is missing, or is not the size its
    writer reported: config.yaml is not written (``--mode resume`` writes it again)."""


class NotAnExportError(ShardexError, FileNotFoundError):
    """A location holds no committed export (no config.yaml)."""


class ExportReplacedError(ShardexError, RuntimeError):
    """A read of an open dataset failed because the export was overwritten or appended to
    since it was opened (its config.yaml changed): reopen it."""


class ClusterUnreachableError(ShardexError, ConnectionError):
    """No Ray cluster answers at the address given (``--ray-address``, ``ray_address=``)."""


class StorageError(ShardexError, OSError):
    """A storage operation failed."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object (file) is missing from a storage."""


class BucketNotFoundError(StorageError, FileNotFoundError):
    """The bucket (or container) of an object-store URL does not exist."""


class FormatError(ShardexError, ValueError):
    """Shard or index bytes do not follow the format."""


class ChecksumError(FormatError):
    """Bytes read back do not match their recorded checksum."""


class SampleNotFoundError(ShardexError, KeyError):
    """No sample has the requested key."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BackendError(ShardexError, LookupError):
    """A backend is unknown, unavailable, or registered twice."""


class MissingDependencyError(BackendError, ImportError):
    """An optional dependency is not installed."""


def imported(module: str, missing: str) -> Any:
    """``module``, imported; a :class:`MissingDependencyError` saying ``missing`` if it is
    not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(missing) from exc


class ShardexWarning(UserWarning):
    """Base class of every warning shardex gives."""


class ParallelismWarning(ShardexWarning):
    """Work meant for worker processes ran in the calling process (the message says why)."""


class RefetchWarning(ShardexWarning):
    """Bytes of a source on object storage that the scan read are fetched again when
    written (the export's scratch could not keep a copy of them; the message says where)."""
