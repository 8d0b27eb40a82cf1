"""Local scratch space of an export: the spilled references of pass 1, the sorted runs of
the key checks and of the index. Nothing here is part of the output.

A scratch folder lives under the system's temporary folder and is named after the
process that made it (``shardex-export-{pid}-...``). It is removed when the export ends,
also on an error; a process killed outright cannot remove it, so every export first
removes the folders of processes that are gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from shardex.errors import ShardexError, StorageError
from shardex.quoting import quoted

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


#: Failures of a scratch folder's file system, not of the export's input or output (the
#: storages map theirs to StorageError, a ShardexError, before they get here).
_SCRATCH_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})


def _scratch_error(exc: OSError, where: str) -> StorageError:
    why = exc.strerror or str(exc).splitlines()[0]
    return StorageError(
        f"cannot write the export's scratch files in {quoted(where)}: {why}; set TMPDIR to "
        "a writable local folder with free space (a 100k-sample tar source needs about "
        "9 MB there)"
    )


def _is_scratch_failure(exc: BaseException) -> bool:
    if not isinstance(exc, OSError) or isinstance(exc, ShardexError):
        return False
    # pyarrow's errors carry no errno, only the system's message
    return exc.errno in _SCRATCH_ERRNOS or "No space left on device" in str(exc)


@contextlib.contextmanager
def scratch(kind: str = "run") -> Iterator[Path]:
    """A new, empty scratch folder, removed on the way out whatever happens.

    Raises:
        StorageError: the temporary folder is not writable or is full (one line, that
            says to set TMPDIR).
    """
    remove_stale()
    root = tempfile.gettempdir()
    try:
        path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{kind}-"))
    except OSError as exc:
        raise _scratch_error(exc, root) from exc
    try:
        yield path
    except BaseException as exc:
        if _is_scratch_failure(exc):
            raise _scratch_error(exc, root) from exc  # type: ignore[arg-type]
        raise
    finally:
        shutil.rmtree(path, ignore_errors=True)
