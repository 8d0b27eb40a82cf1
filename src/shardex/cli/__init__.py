"""The ``shardex`` command: thin; parses arguments, calls the public API, shows progress.

One module per command group: :mod:`~shardex.cli.app` (the group, one-line errors, the
storage flags every command shares), :mod:`~shardex.cli.export` (``export-dataset``),
:mod:`~shardex.cli.read` (``inspect``, ``ls``, ``get``, ``browse``, ``verify``),
:mod:`~shardex.cli.backend`, :mod:`~shardex.cli.pipeline`; ``--config FILE`` in
:mod:`~shardex.cli.config`.
"""

from shardex.cli import backend, export, pipeline, read  # noqa: F401  (they add the commands)
from shardex.cli.app import main

__all__ = ["main"]
