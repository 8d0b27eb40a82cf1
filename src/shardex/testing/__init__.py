"""Conformance suites shipped with shardex, for its own tests and third-party plugins.

Subclass :class:`StorageTests` or :class:`BackendTests` and provide the fixture it asks for.
The suites need pytest and are imported on first use, so test data works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardex.testing.data import SampleFolder, make_image, make_sample_folder

if TYPE_CHECKING:
    from shardex.testing.backend import BackendTests
    from shardex.testing.storage import StorageTests

__all__ = ["BackendTests", "SampleFolder", "StorageTests", "make_image", "make_sample_folder"]


def __getattr__(name: str) -> Any:
    if name == "BackendTests":
        from shardex.testing.backend import BackendTests

        return BackendTests
    if name == "StorageTests":
        from shardex.testing.storage import StorageTests

        return StorageTests
    raise AttributeError(f"module 'shardex.testing' has no attribute {name!r}")
