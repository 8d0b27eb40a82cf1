"""The ``shardex`` command: thin; parses arguments, calls the public API, shows progress.

One module per command group; :mod:`~shardex.cli.app` holds what they share.
"""

from shardex.cli import backend, export, pipeline, read  # noqa: F401  (they add the commands)
from shardex.cli.app import main

__all__ = ["main"]
