"""Local scratch space of an export: the spilled references of pass 1, the sorted runs of
the key checks and of the index. Nothing here is part of the output.

A scratch folder lives under the system's temporary folder and is named after the
process that made it (``shardex-export-{pid}-...``). It is removed when the export ends,
also on an error; a process killed outright cannot remove it, so every export first
removes the folders of processes that are gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

PREFIX: Final = "shardex-export-"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def remove_stale(root: Path | None = None) -> None:
    """Remove the scratch folders of processes that no longer run (killed exports)."""
    root = Path(root or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            pid = entry.name[len(PREFIX) :].partition("-")[0]
            if entry.name.startswith(PREFIX) and pid.isdigit() and _gone(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def scratch(kind: str = "run") -> Iterator[Path]:
    """A new, empty scratch folder, removed on the way out whatever happens."""
    remove_stale()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{kind}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
