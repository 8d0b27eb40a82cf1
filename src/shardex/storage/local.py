"""Local directory storage: ``os.pread`` for ranges, temp file + rename for atomic writes."""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import stat
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from shardex.errors import ObjectNotFoundError, OutputExistsError, StorageError
from shardex.quoting import quoted
from shardex.storage.base import CountingWriter, Storage, checked_path
from shardex.storage.failures import link_refused

if TYPE_CHECKING:
    from shardex.storage.lock import LocalLock

_TMP_MARK = ".tmp-"


def is_temporary(name: str) -> bool:
    """Whether a file name is an in-progress write of :class:`LocalObjectWriter`."""
    return _TMP_MARK in name and name.startswith(".")


def temporary_target(path: str) -> str | None:
    """``[DIR/]NAME`` for an in-progress write ``[DIR/].NAME.tmp-RANDOM``; else None."""
    folder, _, name = path.rpartition("/")
    if not is_temporary(name):
        return None
    target = name[1 : name.rindex(_TMP_MARK)]
    return f"{folder}/{target}" if folder else target


class LocalObjectWriter(CountingWriter):
    """Writes ``.NAME.tmp-RANDOM`` beside ``ROOT/PATH``, then renames it, relative to folder
    descriptors opened without following links (so ``out/train -> /etc`` cannot redirect)."""

    def __init__(self, root: Path, path: str, *, buffer_size: int = 1 << 20) -> None:
        super().__init__()
        self._final = final = root / path
        self._name = final.name
        self._tmp_name = f".{final.name}{_TMP_MARK}{os.urandom(4).hex()}"
        self._dir = -1
        try:
            self._dir = folder_fd(root, path.split("/")[:-1], create=True)
            fd = os.open(self._tmp_name, _NEW_FILE, 0o666, dir_fd=self._dir)
            self._file = open(fd, "wb", buffering=buffer_size)  # noqa: SIM115
        except OSError as exc:  # a file where a folder should be, no permission, ...
            self._close_dir()
            if isinstance(exc, StorageError):
                raise
            raise StorageError(
                f"cannot create {quoted(str(final))}: {exc.strerror or exc}"
                + (f" ({quoted(str(exc.filename))})" if exc.filename else "")
            ) from exc

    def _close_dir(self) -> None:
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1

    def _failed(self, exc: OSError) -> StorageError:
        # ENOSPC, EIO, EDQUOT ...: nothing partial is left behind
        self.abort()
        return StorageError(
            f"cannot write {self._final}: {exc.strerror or exc}; the file was not created"
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise self._failed(exc) from exc
        self._pos += len(data)

    def write_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """``writev`` of the parts straight from their buffers (no copy into one)."""
        try:
            self._file.flush()  # what write() buffered goes first
            self._pos += _writev(self._file.fileno(), parts)
        except OSError as exc:
            raise self._failed(exc) from exc

    def commit(self) -> None:
        # No fsync here: the export's Storage.sync pass does it; starting write-back now
        # in the background leaves that pass little to wait for.
        if self._done:
            return
        try:
            self._file.close()
            refuse_link(self._dir, self._name, self._final)
            os.replace(self._tmp_name, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except OSError as exc:
            self.abort()
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"cannot write {self._final}: {exc.strerror or exc}") from exc
        self._done = True
        self._close_dir()
        _sync_soon(self._final)

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):  # a full disk may fail the flush in close()
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp_name, dir_fd=self._dir)
        self._close_dir()


#: A new file, never an existing one nor through a link (the temporary name is random).
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def refuse_link(folder: int, name: str, where: Path) -> None:
    """Raise :func:`link_refused` when ``name`` in the open folder ``folder`` is a link."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise link_refused(where)


def _open_folders(root: Path, parts: Sequence[str], *, create: bool = False) -> list[int]:
    """Descriptors of ``root`` (which may be a link) and of each folder ``ROOT/PARTS...``,
    each opened relative to the one above and never through a link; made if ``create``."""
    if create:
        root.mkdir(parents=True, exist_ok=True)
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for depth, name in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fds[-1])
            try:
                fds.append(os.open(name, _FOLDER, dir_fd=fds[-1]))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    refuse_link(fds[-1], name, root.joinpath(*parts[: depth + 1]))
                raise
    except BaseException:
        _close(fds)
        raise
    return fds


def folder_fd(root: Path, parts: Sequence[str], *, create: bool = False) -> int:
    """A descriptor of the folder ``ROOT/PARTS...`` (see :func:`_open_folders`)."""
    fds = _open_folders(root, parts, create=create)
    _close(fds[:-1])
    return fds[-1]


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


_IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _writev(fd: int, parts: Sequence[bytes | bytearray | memoryview]) -> int:
    """``writev`` every part to ``fd`` in order, resumed after short writes; bytes written."""
    total = 0
    pending = list(parts)
    while pending:
        batch = pending[:_IOV_MAX]
        done, want = os.writev(fd, batch), sum(map(len, batch))
        total += done
        if done == want:
            del pending[: len(batch)]
            continue
        if done == 0:  # no progress (never seen for a file): as a full disk would say
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        # a short write: drop the parts written whole; the next keeps its rest
        k = 0
        while done >= len(batch[k]):
            done -= len(batch[k])
            k += 1
        del pending[:k]
        pending[0] = memoryview(pending[0])[done:]
    return total


def check_output_folder(root: Path) -> None:
    """Refuse, before any work, an output folder with a file on its path or whose nearest
    existing folder is not writable."""
    probe = root
    while True:
        try:
            st = os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            probe = probe.parent
        except OSError as exc:  # EACCES on a folder above, ELOOP ...
            raise StorageError(
                f"cannot use the output {quoted(str(root))}: {quoted(str(probe))}: {exc.strerror}"
            ) from exc
    if not stat.S_ISDIR(st.st_mode) and probe == root:
        raise OutputExistsError(f"output {quoted(str(root))} exists and is not a folder")
    if not stat.S_ISDIR(st.st_mode):
        raise StorageError(
            f"cannot create the output folder {quoted(str(root))}: {quoted(str(probe))} is a file, not "
            "a folder; choose another output"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise StorageError(
            f"cannot write the output {quoted(str(root))}: no permission to write in "
            f"{quoted(str(probe))}; choose another output or fix its permissions"
        )
    if probe == root:
        _refuse_links(root)


def _refuse_links(folder: Path) -> None:
    """Refuse an output holding a symbolic link: an export deletes and replaces names in
    it, and a link planted in a shared folder must not make it touch the link's target."""
    try:
        entries = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):  # gone meanwhile (another writer's)
        return
    with entries:
        for entry in entries:
            if entry.is_symlink():
                raise link_refused(folder / entry.name)
            if entry.is_dir(follow_symlinks=False):
                _refuse_links(folder / entry.name)


class _Descriptors(dict[str, int]):
    """A storage's open descriptors by path, and the process they belong to."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        super().__init__()
        self.pid = os.getpid()

    def forget(self) -> None:
        """Drop the entries without closing them (a forked child: the parent's)."""
        self.clear()
        self.pid = os.getpid()

    def close(self) -> None:
        if os.getpid() == self.pid:
            for fd in self.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.forget()


class LocalStorage(Storage):
    """Objects are files under a root directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)
        self._fds = _Descriptors()
        # not __del__: at interpreter shutdown it would find the module globals gone
        weakref.finalize(self, self._fds.close)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"LocalStorage({self.uri!r})"

    def _path(self, path: str) -> Path:
        # ``root / "/etc"`` is "/etc" and ``root / "../x"`` climbs out: every path is checked
        return self.root / checked_path(path, self.uri)

    def _fd(self, path: str) -> int:
        # Cached per process: a forked child must not close or reuse the parent's.
        if os.getpid() != self._fds.pid:
            self._fds.forget()
        fd = self._fds.get(path)
        if fd is None:
            full = self._path(path)  # outside the try: its StorageError is an OSError too
            try:
                fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise ObjectNotFoundError(f"{self.join(path)} does not exist") from exc
            except OSError as exc:
                raise StorageError(f"cannot open {self.join(path)}: {exc.strerror}") from exc
            self._fds[path] = fd
        return fd

    def close(self) -> None:
        """Close cached file descriptors."""
        self._fds.close()

    def _forget(self, path: str) -> None:
        """Close ``path``'s cached descriptor (it would keep a deleted file's space)."""
        fd = self._fds.pop(path, None)
        if fd is not None and os.getpid() == self._fds.pid:
            os.close(fd)

    def get(self, path: str) -> bytes:
        try:
            return self._path(path).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{self.join(path)} does not exist") from exc
        except IsADirectoryError as exc:
            raise ObjectNotFoundError(f"{self.join(path)} is a directory") from exc

    def get_range(self, path: str, start: int, length: int) -> bytes:
        return os.pread(self._fd(path), length, start)

    def size(self, path: str) -> int:
        try:
            return self._path(path).stat().st_size
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{self.join(path)} does not exist") from exc

    def exists(self, path: str) -> bool:
        return self._path(path).is_file()

    def _walk(self, prefix: str, *, temporary: bool) -> builtins.list[str]:
        found = []  # os.walk yields nothing for a missing root
        for dirpath, _dirs, files in os.walk(self.root):
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in files:
                if is_temporary(name) != temporary:
                    continue
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                rel = rel.replace(os.sep, "/")
                if rel.startswith(prefix):
                    found.append(rel)
        return sorted(found)

    def list(self, prefix: str = "") -> Iterator[str]:
        return iter(self._walk(prefix, temporary=False))  # in-progress writes are not objects

    def leftovers(self) -> builtins.list[str]:
        return self._walk("", temporary=True)

    def delete(self, path: str) -> None:
        self._forget(path)
        *folders, name = checked_path(path, self.uri).split("/")
        try:
            opened = _open_folders(self.root, folders)
        except FileNotFoundError:
            return
        try:
            os.unlink(name, dir_fd=opened[-1])  # removes a link itself, never its target
            # Folders left empty go too, as an object store has no folders.
            for depth in range(len(folders), 0, -1):
                try:
                    os.rmdir(folders[depth - 1], dir_fd=opened[depth - 1])
                except OSError:  # not empty
                    break
        except FileNotFoundError:
            return
        finally:
            _close(opened)

    def rename(self, source: str, target: str) -> None:
        self._forget(source)
        self._forget(target)
        *source_folders, source_name = checked_path(source, self.uri).split("/")
        *target_folders, target_name = checked_path(target, self.uri).split("/")
        source_fd = folder_fd(self.root, source_folders)
        try:
            target_fd = folder_fd(self.root, target_folders, create=True)
            try:
                refuse_link(target_fd, target_name, self._path(target))
                os.replace(source_name, target_name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
            finally:
                os.close(target_fd)
        finally:
            os.close(source_fd)

    def open_writer(self, path: str) -> LocalObjectWriter:
        return LocalObjectWriter(self.root, checked_path(path, self.uri))

    def lock(self, holder: str) -> LocalLock:
        """``flock`` on ``ROOT/.shardex-lock``: released by the kernel if this process dies."""
        from shardex.storage.lock import LocalLock  # writers only: readers never lock

        return LocalLock(self.root, holder)

    def local_path(self, path: str) -> Path:
        return self.root if path == "" else self._path(path)

    def sync(self, paths: Iterable[str]) -> None:
        """fsync the files and then their folders, so that they survive a power loss; threads
        share each journal commit (~5 ms; ext4/xfs group commit)."""
        files = [self._path(path) for path in paths]
        _fsync_all(files)
        _fsync_all([self.root, *dict.fromkeys(full.parent for full in files)])


#: Files whose early fsync may wait at once; past it a file waits for the sync pass.
_EARLY_PENDING: Final = 64
_early: tuple[Any, threading.BoundedSemaphore] | None = None
_early_lock = threading.Lock()


def _forget_early() -> None:
    global _early, _early_lock
    _early, _early_lock = None, threading.Lock()  # a forked child has none of the threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_early)


def _sync_soon(path: Path) -> None:
    """fsync ``path`` in the background (not while :data:`_EARLY_PENDING` files wait);
    errors are left to the export's sync pass."""
    global _early
    if _early is None:
        from concurrent.futures import ThreadPoolExecutor  # writers only: not on import

        with _early_lock:
            if _early is None:
                pool = ThreadPoolExecutor(2, thread_name_prefix="shardex-sync")
                _early = (pool, threading.BoundedSemaphore(_EARLY_PENDING))
    pool, pending = _early
    if not pending.acquire(blocking=False):
        return

    def sync() -> None:
        try:
            with contextlib.suppress(OSError):  # renamed, deleted, failing: the pass reports
                _fsync(path)
        finally:
            pending.release()

    try:
        pool.submit(sync)
    except RuntimeError:  # the interpreter is shutting down
        pending.release()


#: Threads that fsync at once: enough to share each journal commit between many files.
_SYNC_THREADS: Final = 16


def _fsync_all(paths: builtins.list[Path]) -> None:
    """fsync each path (up to 1,024 at once); an error is raised once the others end."""
    if len(paths) <= 1:
        for path in paths:
            _fsync(path)
        return
    from concurrent.futures import ThreadPoolExecutor  # writers only: not on import

    with ThreadPoolExecutor(min(_SYNC_THREADS, len(paths))) as pool:
        for at in range(0, len(paths), 1024):  # a bounded number of futures at a time
            list(pool.map(_fsync, paths[at : at + 1024]))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
