"""``python -m shardex.cli``: the ``shardex`` command."""

import sys

from shardex.cli import main

sys.exit(main())
