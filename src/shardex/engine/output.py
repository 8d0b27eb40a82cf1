"""What the output holds, and what a writer records there.

Nothing writes a file the committed config.yaml names (except derived shard lists, just
after the commit): new files take unused names (:func:`shardex.backends.base.unused_name`)
that depend only on the committed config and the input, so a killed export run again writes
the same files; config.yaml commits in one put and old files go after it. Every writer holds
the output's lock and records ``.shardex-intent.json``, so a run after a kill knows whether
the killed one had committed.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Final

import xxhash

from shardex.backends.ownership import INTENT_FILE, foreign_files, run_owns, shardex_files, writers
from shardex.contract import CONFIG_FILE, ExportConfig
from shardex.engine.commit import (
    commit,
    derived_files,
    export_files,
    remove_leftovers,
    write_derived,
)
from shardex.errors import ObjectNotFoundError, OutputExistsError, ShardexError, mode_hint
from shardex.options import ExportOptions, Mode
from shardex.quoting import quoted
from shardex.sources import Source
from shardex.storage import Storage
from shardex.storage.local import check_output_folder, temporary_target
from shardex.storage.lock import LOCK_FILE
from shardex.storage.staging import STAGING, is_staged

#: Files of a writer at work, never part of an export.
CONTROL: Final = frozenset({INTENT_FILE, LOCK_FILE})


def check_root(storage: Storage) -> None:
    root = storage.local_path("")
    if root is not None:
        check_output_folder(root)


def check_output(storage: Storage, mode: Mode) -> list[str]:
    """Refuse what the mode does not allow; return the old files to replace or resume.

    A temporary file counts as the file it was to become: shardex's are a killed export's
    (deleted: we hold the lock), any other is foreign and refused, never deleted.
    """
    listed = [p for p in storage.list() if p != LOCK_FILE]
    temporary = storage.leftovers()
    existing = [p for p in listed if not p.startswith(STAGING)]
    leftovers = {p: temporary_target(p) or p for p in temporary if not p.startswith(STAGING)}
    foreign = set(foreign_files(storage, [*existing, *leftovers.values()]))
    found = [
        *(p for p in existing if p in foreign),
        *(p for p, target in leftovers.items() if target in foreign),
        # a user's own folder named like our staging: what no run stages there is theirs
        *(p for p in (*listed, *temporary) if p.startswith(STAGING) and not is_staged(p)),
    ]
    if found:
        raise OutputExistsError(
            f"output {storage.uri} holds files shardex did not write (e.g. {quoted(found[0])}"
            f"{f' and {len(found) - 1} more' if len(found) > 1 else ''}); export into an "
            "empty or new folder, or move them out of it"
        )
    committed = CONFIG_FILE in existing
    if mode == "append" and not committed:
        raise OutputExistsError(
            f"output {storage.uri} holds no complete export to append to (no {CONFIG_FILE})"
        )
    if committed and mode == "resume":
        raise OutputExistsError(
            f"output {storage.uri} holds a complete export: nothing to resume "
            "(use mode 'overwrite' to write it again)"
        )
    if (existing or leftovers) and mode == "error":
        what = "holds an export" if committed else "holds the files of an unfinished export"
        hint = f"{mode_hint('overwrite')} to replace it" + (
            "" if committed else f", or {mode_hint('resume')} to finish it"
        )
        raise OutputExistsError(f"output {storage.uri} {what}; pass {hint}")
    for path in leftovers:  # temporary files of a killed export
        storage.delete(path)
    return existing


def committed_files(storage: Storage, old_files: list[str]) -> frozenset[str]:
    """The files the committed config.yaml names: the new export must not write them."""
    if CONFIG_FILE not in old_files:
        return frozenset()
    try:
        return frozenset(export_files(ExportConfig.read(storage)))
    except ShardexError:  # an unreadable config.yaml: keep clear of every file there
        return frozenset(old_files)


def command_digest(
    src: Source, opts: ExportOptions, pipeline: tuple[dict[str, Any], ...], spec: str | None
) -> str:
    """The source and every option that changes the output (not workers, nor mode)."""
    fields = {
        f.name: getattr(opts, f.name)
        for f in dataclasses.fields(opts)
        if f.name not in ("workers", "mode", "overwrite")
    }
    if fields["layout"] == "split":  # the default: the digest of runs of earlier versions
        del fields["layout"]
    text = json.dumps([src.uri, fields, pipeline, spec], sort_keys=True, default=str)
    return str(xxhash.xxh3_64_hexdigest(text.encode()))


def config_digest(storage: Storage) -> str | None:
    try:
        return str(xxhash.xxh3_64_hexdigest(storage.get(CONFIG_FILE)))
    except ObjectNotFoundError:
        return None


def record_intent(
    storage: Storage, mode: Mode, command: str, top_level: bool = False, backend: str = ""
) -> None:
    """Before anything is written: which command writes over which committed export, whether
    top-level files are shardex's (``top_level``) and which backends' files the output may
    hold (:mod:`shardex.backends.ownership`)."""
    record: dict[str, Any] = {"mode": mode, "command": command, "base": config_digest(storage)}
    before = writers(storage)
    if backend and (before is not None or read_intent(storage) is None):  # else: unsaid
        record["backends"] = list(dict.fromkeys([*(before or []), backend]))
    if top_level:
        record["top_level"] = True
    storage.put(INTENT_FILE, json.dumps(record).encode())


def read_intent_bytes(storage: Storage) -> bytes | None:
    try:
        return storage.get(INTENT_FILE)
    except ObjectNotFoundError:
        return None


def undo(
    storage: Storage,
    old_files: list[str],
    committed: frozenset[str],
    intent: bytes | None,
    backend: str,
    flat: bool,
) -> None:
    """Delete what this run wrote (only names ``backend`` writes, so an export made into a
    folder inside the output keeps its files), leaving the output as the run found it."""
    before = set(old_files) | committed | CONTROL
    for path in storage.list():
        if not path.startswith(STAGING) and path not in before and run_owns(backend, flat, path):
            storage.delete(path)
    for path in storage.leftovers():
        target = temporary_target(path)
        if target is not None and run_owns(backend, flat, target):
            storage.delete(path)
    if intent is None:
        storage.delete(INTENT_FILE)
    else:
        storage.put(INTENT_FILE, intent)


def read_intent(storage: Storage) -> dict[str, Any] | None:
    try:
        record = json.loads(storage.get(INTENT_FILE))
    except (ObjectNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def finish_committed(
    storage: Storage, mode: Mode, command: str, legacy: bool = False
) -> ExportConfig | None:
    """Finish the clean-up of a run of this command (any, for ``resume``) killed after it
    committed, and return its config (``legacy``: an old promotion was just finished)."""
    if not (legacy and mode == "resume"):
        intent = read_intent(storage)
        if intent is None:
            return None
        now = config_digest(storage)
        if now is None or now == intent.get("base"):
            return None  # it had not committed
        if mode != "resume" and (intent.get("command"), intent.get("mode")) != (command, mode):
            return None  # another command: it replaces or extends what is there
    config = ExportConfig.read(storage)
    remove_leftovers(storage, config)
    write_derived(storage, derived_files(config))  # killed before it replaced them
    ours = shardex_files(storage, storage.list())
    remove_stale(storage, ours, config)
    storage.delete(INTENT_FILE)
    return config


def promote_legacy(storage: Storage) -> ExportConfig | None:
    """Repair an old shardex's kill between its commit and renaming ``.pending`` files:
    commit a config.yaml naming the files that exist; None if nothing to do."""
    try:
        config = ExportConfig.read(storage)
    except ShardexError:
        return None

    def usual(name: str) -> str:
        if ".pending." not in name or storage.exists(name):
            return name
        renamed = name.replace(".pending.", ".")
        return renamed if storage.exists(renamed) else name

    splits = {
        name: dataclasses.replace(
            info,
            index=dataclasses.replace(
                info.index, samples=usual(info.index.samples), keys=usual(info.index.keys)
            ),
        )
        if info.index is not None
        else info
        for name, info in config.splits.items()
    }
    metadata = usual(config.metadata_file) if config.metadata_file else None
    fixed = dataclasses.replace(config, splits=splits, metadata_file=metadata)
    if fixed == config:
        return None
    commit(storage, fixed)
    return fixed


def resumed(storage: Storage, opts: ExportOptions, command: str) -> ExportOptions:
    """``resume`` over a committed export finishes a killed overwrite or append."""
    intent = read_intent(storage)
    if opts.mode != "resume" or intent is None or not storage.exists(CONFIG_FILE):
        return opts
    mode = intent.get("mode")
    if mode not in ("overwrite", "append"):
        return opts
    if intent.get("command") != command:
        raise OutputExistsError(
            f"output {storage.uri} holds a complete export and the files of an interrupted "
            f"--mode {mode} of another source or other options; resume that one with the "
            "same source and options, or pass --overwrite"
        )
    return dataclasses.replace(opts, mode=mode)


def remove_stale(storage: Storage, old_files: list[str], config: ExportConfig) -> None:
    """Delete files of a replaced export that the new one does not have."""
    keep = {CONFIG_FILE, *export_files(config)}
    # A shard folder whose files config.yaml does not list (numpy's) keeps what is under it.
    listed = [f for info in config.splits.values() for f in info.files]
    folders = {
        s.path
        for info in config.splits.values()
        for s in info.shards
        if not any(f.startswith(f"{s.path}/") for f in listed)
    }
    for path in old_files:
        parents = (path[:i] for i, c in enumerate(path) if c == "/")
        if path not in keep | CONTROL and not any(p in folders for p in parents):
            storage.delete(path)
