"""Conformance suites shipped with shardex, for its own tests and third-party plugins.

Subclass :class:`StorageTests` or :class:`BackendTests` in a test file and provide the one
fixture each asks for; every shared test then runs against your implementation. Needs
pytest (the ``test`` extra).
"""

from shardex.testing.backend import BackendTests
from shardex.testing.data import SampleFolder, make_image, make_sample_folder
from shardex.testing.storage import StorageTests

__all__ = ["BackendTests", "SampleFolder", "StorageTests", "make_image", "make_sample_folder"]
