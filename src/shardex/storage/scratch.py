"""Local scratch space: an export's spilled references of pass 1 and the sorted runs of
its key checks and index, and the locked folders of downloads (the cache, tensordict's
runs, DALI's staging). Nothing here is part of an output.

A scratch folder lives under the system's temporary folder and is named after the
process that made it (``shardex-export-{pid}-...``). It is removed when the export ends,
also on an error; a process killed outright cannot remove it, so every export first
removes the folders of exports that are gone. An export holds a lock on its folder's
``.lock`` file (``flock``: the kernel drops it when the process dies, however it dies),
and a folder is stale when that lock is free: a process ID alone would misjudge a live
export in another PID namespace (containers sharing a temporary folder) and keep the
folder of a killed one whose ID was reused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from shardex.errors import ShardexError, StorageError
from shardex.quoting import quoted

PREFIX: Final = "shardex-export-"
LOCK_FILE: Final = ".lock"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def _stale(entry: Path, prefix: str) -> bool:
    """Whether no process holds the folder ``entry`` (its lock is free; a folder without
    a lock file, an earlier shardex's or one being renamed: its process is gone)."""
    try:
        fd = os.open(entry / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        pid = entry.name.lstrip(".")[len(prefix) :].partition("-")[0]
        return pid.isdigit() and _gone(int(pid))
    except OSError:  # not a folder: not one of ours
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def remove_stale(root: Path | None = None, prefix: str = PREFIX) -> None:
    """Remove the folders under ``root`` named ``prefix...`` (by :func:`locked_folder`)
    whose processes no longer run (killed): by default, the scratch folders of exports."""
    root = Path(root or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            # ".PREFIX...": a folder being made (or left by a kill just then)
            if entry.name.lstrip(".").startswith(prefix) and _stale(entry, prefix):
                shutil.rmtree(entry, ignore_errors=True)


def locked_folder(root: Path, prefix: str, kind: str) -> tuple[Path, int]:
    """A new folder ``root/{prefix}{pid}-{kind}-...`` and the descriptor of its locked
    ``.lock`` (close it to release the folder; :func:`remove_stale` removes the folder
    once its process is gone): made under a name ``remove_stale`` judges by the process
    ID, locked, then renamed (never seen without its lock)."""
    draft = Path(tempfile.mkdtemp(prefix=f".{prefix}{os.getpid()}-{kind}-", dir=root))
    # The lock file gets its name only once locked: another export that finds ``.lock``
    # free between its creation and the flock would take the folder for stale
    new = draft / f"{LOCK_FILE}.new"
    fd = os.open(new, os.O_RDWR | os.O_CREAT, 0o600)
    path = draft.with_name(draft.name[1:])
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        new.rename(draft / LOCK_FILE)
        draft.rename(path)
    except OSError:
        os.close(fd)
        shutil.rmtree(draft, ignore_errors=True)
        raise
    return path, fd


#: Failures of a scratch folder's file system, not of the export's input or output (the
#: storages map theirs to StorageError, a ShardexError, before they get here).
_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def _scratch_error(exc: OSError, where: str) -> StorageError:
    why = exc.strerror or str(exc).splitlines()[0]
    return StorageError(
        f"cannot write the export's scratch files in {quoted(where)}: {why}; set TMPDIR to "
        "a writable local folder with free space (a 100k-sample tar source needs about "
        "9 MB there)"
    )


def _is_scratch_failure(exc: BaseException, path: Path) -> bool:
    """Whether ``exc`` is a failure to write ``path`` (a source's unreadable file is not:
    it names another file)."""
    if not isinstance(exc, OSError) or isinstance(exc, ShardexError):
        return False
    if exc.filename is not None:
        return str(exc.filename).startswith(str(path))
    # a failed flush names no file; pyarrow's errors carry no errno, only the message
    return exc.errno in _FULL or "No space left on device" in str(exc)


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
        path, lock = locked_folder(Path(root), PREFIX, kind)
    except OSError as exc:
        raise _scratch_error(exc, root) from exc
    try:
        yield path
    except BaseException as exc:
        if _is_scratch_failure(exc, path):
            raise _scratch_error(exc, root) from exc  # type: ignore[arg-type]
        raise
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)
