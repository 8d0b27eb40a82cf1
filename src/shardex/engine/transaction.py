"""The output as one export run writes it: lock, leftovers, committed export, intent,
undo and commit in one object, entered once (rules: :mod:`shardex.engine.output`)."""

from __future__ import annotations

import contextlib
from types import TracebackType

from shardex.backends.base import Backend
from shardex.backends.ownership import INTENT_FILE, committed_is_flat
from shardex.contract import ExportConfig
from shardex.engine.commit import commit
from shardex.engine.output import (
    check_output,
    committed_files,
    finish_committed,
    promote_legacy,
    read_intent_bytes,
    record_intent,
    remove_stale,
    resumed,
    undo,
)
from shardex.engine.prepare import appending_options
from shardex.options import ExportOptions
from shardex.storage import Storage
from shardex.storage.lock import OutputLock, holder_text
from shardex.storage.staging import remove_killed_parts


class Transaction:
    """One run's hold on the output. Entering takes the lock (or uses the caller's),
    removes killed runs' leftovers, and either finds the run :attr:`done` (killed after
    it committed) or checks the output for the mode, setting :attr:`opts`,
    :attr:`old_files`, :attr:`committed` and :attr:`previous` (the export appended to)."""

    def __init__(
        self,
        storage: Storage,
        opts: ExportOptions,
        command: str,
        backend: Backend,
        lock: OutputLock | None = None,
    ) -> None:
        self.storage, self.opts, self.command, self.backend = storage, opts, command, backend
        self._given = lock
        self._stack = contextlib.ExitStack()
        self.lock: OutputLock | None = None
        self.done: ExportConfig | None = None
        self.old_files: list[str] = []
        self.committed: frozenset[str] = frozenset()
        self.previous: ExportConfig | None = None
        self._intent: bytes | None = None
        self._flat: bool | None = None

    def __enter__(self) -> Transaction:
        storage, opts = self.storage, self.opts
        self.lock = self._given or self._stack.enter_context(
            storage.lock(holder_text(f"export --mode {opts.mode}"))
        )
        try:
            # killed Ray runs' staged parts go (we hold the lock: no live run stages any,
            # but a write_shardex that gave us its lock)
            remove_killed_parts(storage, rows=self._given is None)
            repaired = promote_legacy(storage) if opts.mode != "error" else None
            self.done = finish_committed(storage, opts.mode, self.command, repaired is not None)
            if self.done is None:
                self.opts = resumed(storage, opts, self.command)
                self.old_files = check_output(storage, self.opts.mode)
                self.committed = committed_files(storage, self.old_files)
                if self.opts.mode == "append":
                    self.previous = ExportConfig.read(storage)
                    self.opts = appending_options(self.opts, self.previous)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def begin(self) -> None:
        """Record the intent before the first write."""
        self._intent = read_intent_bytes(self.storage)
        self._flat = self.opts.layout == "flat" or committed_is_flat(self.storage)
        record_intent(self.storage, self.opts.mode, self.command, self._flat, self.backend.name)

    def undo(self) -> None:
        if self._flat is not None:
            undo(
                self.storage,
                self.old_files,
                self.committed,
                self._intent,
                self.backend.name,
                self._flat,
            )

    def commit(self, config: ExportConfig) -> None:
        """Commit (unless the lock was taken over), then delete the replaced files."""
        assert self.lock is not None  # entered
        self.lock.check()
        commit(self.storage, config)
        remove_stale(self.storage, self.old_files, config)
        self.storage.delete(INTENT_FILE)
