"""One writer per output: an exclusive lock taken before an export looks at its output.

Local folders use ``flock`` (dropped by the kernel when the process dies; works on NFS).
Object stores get a lease made with ``If-None-Match: *``, renewed every ``lease / 4`` s
with ``If-Match`` and taken over the same way once expired, so one racing export wins.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import math
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Final, Protocol, Self

from shardex.errors import OutputLockedError, StorageError
from shardex.quoting import quoted
from shardex.storage.failures import link_refused


class Leased(Protocol):
    """What a lease needs of a storage (base.py imports this module, not the reverse)."""

    uri: str

    def get_tagged(self, path: str) -> tuple[bytes, str] | None: ...

    def put_if(self, path: str, data: bytes, tag: str | None) -> str | None: ...

    def delete(self, path: str) -> None: ...


LOCK_FILE: Final = ".shardex-lock"
_LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DEFAULT_LEASE: Final = 60.0
#: A lease expiring further ahead than this is unreadable (taken over like a garbled one).
_LONGEST_LEASE: Final = 7 * 24 * 3600.0


def holder_text(what: str) -> str:
    """Who holds a lock, for the message another writer gets."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{what} by pid {os.getpid()} on {socket.gethostname()} since {now}"


def lease_seconds() -> float:
    try:
        return max(float(os.environ.get("SHARDEX_LOCK_LEASE") or DEFAULT_LEASE), 1.0)
    except ValueError:
        return DEFAULT_LEASE


class OutputLock:
    """A held lock; :meth:`check` raises when it was lost (a lease that was taken over)."""

    def check(self) -> None:
        """Raise OutputLockedError if this process no longer holds the lock."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Give the lock back."""


#: Characters of a holder's text that a message shows (a lease is anyone's bytes).
_HOLDER_CHARS: Final = 200


def _shown(holder: str) -> str:
    holder = holder.strip() or "unknown holder"
    if len(holder) > _HOLDER_CHARS:
        holder = f"{holder[:_HOLDER_CHARS]}... ({len(holder):,} characters)"
    return holder


def _locked(uri: str, holder: str) -> OutputLockedError:
    return OutputLockedError(
        f"output {uri} is being written by another export ({holder}); "
        "wait for it to end, or write to another output"
    )


class LocalLock(OutputLock):
    """``flock`` on ``ROOT/.shardex-lock``; a folder it made is removed if left empty."""

    def __init__(self, root: Path, holder: str) -> None:
        self._root, self._path = root, root / LOCK_FILE
        self._made_root = False
        try:
            self._made_root = not root.exists()
            root.mkdir(parents=True, exist_ok=True)
            self._fd = self._take()
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, holder.encode(), 0)
        except OSError as exc:
            self._remove_root()
            raise StorageError(f"cannot lock {root}: {exc.strerror or exc}") from exc

    def _take(self) -> int:
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace")
                os.close(fd)
                self._remove_root()
                raise _locked(str(self._root), _shown(holder)) from None
            # The last holder unlinks the file as it releases: a lock on it locks nothing.
            try:
                same = os.stat(self._path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def _open(self) -> int:
        """The lock file, never through a link (truncating would destroy its target) and
        refused unless a plain file of its own (a hard link shares its bytes)."""
        try:
            fd = os.open(self._path, _LOCK_FLAGS, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise link_refused(self._path) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            os.close(fd)
            self._remove_root()
            raise StorageError(
                f"{quoted(str(self._path))} is not a plain file of its own (a hard link, or "
                "not a file); shardex never writes through it: remove it, or choose another "
                "output"
            )
        return fd

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            self._path.unlink()  # while still locked: the next writer takes a new file
        os.close(self._fd)
        self._fd = -1
        self._remove_root()

    def _remove_root(self) -> None:
        if self._made_root:
            with contextlib.suppress(OSError):  # not empty: an export was written
                self._root.rmdir()


class LeaseLock(OutputLock):
    """A lease on ``.shardex-lock`` in an object store, renewed by a thread."""

    def __init__(self, storage: Leased, holder: str, lease: float | None = None) -> None:
        self._storage, self._holder = storage, holder
        self._lease = lease_seconds() if lease is None else lease
        self._lost: str | None = None
        self._stop = threading.Event()
        self._until = time.time() + self._lease
        self._tag = self._take()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="shardex-lease")
        self._thread.start()

    def _body(self) -> bytes:
        return json.dumps({"holder": self._holder, "expires": time.time() + self._lease}).encode()

    def _take(self) -> str:
        tag = self._storage.put_if(LOCK_FILE, self._body(), None)
        if tag is not None:
            return tag
        found = self._storage.get_tagged(LOCK_FILE)
        if found is None:  # released between our two requests: try once more
            tag = self._storage.put_if(LOCK_FILE, self._body(), None)
        else:
            data, old_tag = found
            try:
                held = json.loads(data)
                holder, expires = str(held["holder"]), float(held["expires"])
                # no lease runs for years: infinite or absurd, it is unreadable
                if not math.isfinite(expires) or expires > time.time() + _LONGEST_LEASE:
                    raise ValueError(expires)
            except (ValueError, KeyError, TypeError):
                holder, expires = "an unreadable lock", 0.0
            if expires > time.time():
                until = datetime.datetime.fromtimestamp(expires, datetime.UTC)
                raise _locked(
                    self._storage.uri,
                    f"{_shown(holder)}; its lease runs until {until:%H:%M:%S} UTC unless renewed",
                )
            tag = self._storage.put_if(LOCK_FILE, self._body(), old_tag)  # take it over
        if tag is None:
            raise _locked(self._storage.uri, "another export took the lock at the same moment")
        return tag

    def _renew(self) -> None:
        while not self._stop.wait(self._lease / 4):
            sent = time.time()
            try:
                tag = self._storage.put_if(LOCK_FILE, self._body(), self._tag)
            except StorageError:
                continue  # retried at the next tick; the lease has time left
            if tag is None:
                self._lost = "its lease on the output was taken over by another export"
                return
            self._tag = tag
            self._until = sent + self._lease

    def check(self) -> None:
        if self._lost is None and time.time() > self._until:  # renewals kept failing
            self._lost = "its lease expired: the store did not answer the renewals in time"
        if self._lost is not None:
            raise OutputLockedError(
                f"output {self._storage.uri}: this export no longer holds the lock "
                f"({self._lost}); nothing was committed"
            )

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self._lost is None:
            with contextlib.suppress(StorageError):
                self._storage.delete(LOCK_FILE)
