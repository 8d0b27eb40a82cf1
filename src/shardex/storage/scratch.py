"""Local scratch folders (an export's spills and sorted runs; locked download folders).

Each export first removes folders whose ``.lock`` (``flock``, dropped by the kernel when
the process dies) is free: a PID alone misjudges other PID namespaces and reused IDs.
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
    """Whether no process holds ``entry`` (without a lock file: judged by its PID)."""
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
    """Remove the :func:`locked_folder` folders under ``root`` whose processes are gone."""
    root = Path(root or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            # ".PREFIX...": a folder being made (or left by a kill just then)
            if entry.name.lstrip(".").startswith(prefix) and _stale(entry, prefix):
                shutil.rmtree(entry, ignore_errors=True)


def locked_folder(root: Path, prefix: str, kind: str) -> tuple[Path, int]:
    """A new folder ``root/{prefix}{pid}-{kind}-...`` and its locked ``.lock``'s descriptor
    (close it to release); made under a dot name, locked, then renamed."""
    draft = Path(tempfile.mkdtemp(prefix=f".{prefix}{os.getpid()}-{kind}-", dir=root))
    # Named ``.lock`` only once locked, or another export could find it free: stale
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


#: Scratch file system failures (input and output ones arrive as ShardexError).
_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def _scratch_error(exc: OSError, where: str) -> StorageError:
    why = exc.strerror or str(exc).splitlines()[0]
    return StorageError(
        f"cannot write the export's scratch files in {quoted(where)}: {why}; set TMPDIR to "
        "a writable local folder with free space (a 100k-sample tar source needs about "
        "9 MB there)"
    )


def _is_scratch_failure(exc: BaseException, path: Path) -> bool:
    """Whether ``exc`` is a failure to write under ``path``."""
    if not isinstance(exc, OSError) or isinstance(exc, ShardexError):
        return False
    if exc.filename is not None:
        return str(exc.filename).startswith(str(path))
    # a failed flush names no file; pyarrow's errors carry no errno, only the message
    return exc.errno in _FULL or "No space left on device" in str(exc)


@contextlib.contextmanager
def scratch(kind: str = "run") -> Iterator[Path]:
    """A new, empty scratch folder, removed on the way out whatever happens (a
    StorageError if the temporary folder is not writable or is full)."""
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
