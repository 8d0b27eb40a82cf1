"""Which files of an output shardex wrote: the export's own files, and what each backend
declares it writes (:attr:`Backend.files <shardex.backends.base.Backend.files>`).

An overwrite or a resume replaces only what shardex wrote; anything else in the output
means the user pointed shardex at the wrong folder, and the export is refused. A plugin
backend's files count as shardex's as soon as it is registered.

Files at the output's top level (the flat layout's shards and index) count as a backend's
only where a flat export is or was at work: the committed config.yaml says
``layout: flat``, or the intent file of a run says it writes or replaces a flat export
(``top_level``). A NeMo Curator output (``images-{hash}-000000.tar`` ... at the top level,
named like a flat export's shards) is someone else's, and is neither overwritten nor
deleted, also beside a split-folder export.

Which backends may own files follows the backends that wrote the output: the one the
committed config.yaml names, and those the intent file of a run at work records
(``backends``: the backend it writes with and those whose files it found), so an array
export does not own a ``train/shards.txt`` because the webdataset backend writes one. An
output that tells neither (shardex versions before this record) is claimed by any backend.

Backends are asked lazily, cheapest first: the one config.yaml names, then those already
imported (the one being exported with), then the others, so a folder holding one
backend's export does not import every backend's dependencies (torch, zarr) to be checked.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from typing import Final

from shardex.backends.registry import REGISTRY
from shardex.contract import CONFIG_FILE, ExportConfig
from shardex.errors import ShardexError
from shardex.storage.base import Storage

#: The files of an export that no backend writes: its contract, the writer's control files
#: and the top-level tables, under their second names too (and ``.pending``: the leftovers
#: of shardex versions that renamed after committing).
_EXPORT_FILES: Final = re.compile(
    r"config\.yaml|\.shardex-intent\.json|\.shardex-lock"
    r"|metadata(?:\.pending|\.2)?\.parquet|errors(?:\.2)?\.parquet"
)


def foreign_files(storage: Storage, paths: Iterable[str]) -> list[str]:
    """The ``paths`` of the output at ``storage`` (relative to its root) that neither the
    export itself nor any registered backend writes.

    Raises:
        BackendError, MissingDependencyError: some paths are claimed by no backend, and the
            committed config.yaml names a backend that is not registered or not installed
            here (its files cannot be told from foreign ones).
    """
    paths = list(paths)
    rest = [p for p in paths if _EXPORT_FILES.fullmatch(p) is None]
    if not rest:
        return rest
    owners = writers(storage)
    if not _top_level_ours(storage, paths):  # no flat export here: nothing at the top is ours
        top = [p for p in rest if "/" not in p]
        return top + _owned(storage, [p for p in rest if "/" in p], owners)
    return _owned(storage, rest, owners)


def export_owns(config: ExportConfig, path: str) -> bool:
    """Whether ``path`` is a name the export that ``config`` describes writes: its own
    files, or its backend's (at the output's top level only when the export is flat)."""
    return run_owns(config.backend, config.flat, path)


def run_owns(backend: str, flat: bool, path: str) -> bool:
    """Whether ``path`` is a name an export with ``backend`` writes (``flat``: one that
    writes or replaces a flat export, so the top level's shards are its too)."""
    if _EXPORT_FILES.fullmatch(path) is not None:
        return True
    if "/" not in path and not flat:
        return False
    try:
        return REGISTRY.backend_class(backend).owns(path)
    except ShardexError:  # not installed here: its files cannot be told
        return False


def _top_level_ours(storage: Storage, paths: list[str]) -> bool:
    """Whether files at the top level may be a backend's: a flat export is committed there,
    or a run that writes or replaces one recorded its intent."""
    if INTENT_FILE in paths:
        try:
            record = json.loads(storage.get(INTENT_FILE))
        except (ShardexError, OSError, ValueError):
            record = None
        if isinstance(record, dict) and record.get("top_level") is True:
            return True
    return CONFIG_FILE in paths and committed_is_flat(storage)


def committed_is_flat(storage: Storage) -> bool:
    """Whether the output holds a committed export with ``layout: flat``."""
    config = _committed(storage)
    return config is not None and config.flat


def _owned(storage: Storage, rest: list[str], owners: list[str] | None) -> list[str]:
    """The ``rest`` that none of ``owners`` (None: no registered backend) writes."""
    if not rest:
        return rest
    committed = _committed_backend(storage)
    unknown: ShardexError | None = None
    for name in _order(committed) if owners is None else owners:
        try:
            backend = REGISTRY.backend_class(name)
        except ShardexError as exc:  # not installed here, or a plugin that fails to import
            unknown = exc if name == committed or owners is not None else unknown
            continue
        rest = [p for p in rest if not backend.owns(p)]
        if not rest:
            return rest
    if unknown is not None:
        raise unknown
    return rest


#: The intent file of a run at work (see :func:`shardex.engine.output.record_intent`).
INTENT_FILE: Final = ".shardex-intent.json"


def shardex_files(storage: Storage, paths: Iterable[str]) -> list[str]:
    """The ``paths`` that the export or a registered backend writes, in their order."""
    paths = list(paths)
    foreign = set(foreign_files(storage, paths))
    return [p for p in paths if p not in foreign]


def _order(committed: str | None) -> list[str]:
    """Backend names in the order to ask them (see the module docstring)."""
    entries = REGISTRY.entries()
    imported = [e.name for e in entries if e.target.partition(":")[0] in sys.modules]
    cheap = [e.name for e in entries if not e.requires and e.available]
    dear = [e.name for e in entries if e.requires and e.available]
    first = [committed] if committed is not None else []
    return list(dict.fromkeys([*first, *imported, *cheap, *dear]))


def writers(storage: Storage) -> list[str] | None:
    """The backends whose files the output may hold: the committed export's, and those the
    intent file of a run at work names; None when the output tells neither (any backend's)."""
    committed = _committed_backend(storage)
    try:
        record = json.loads(storage.get(INTENT_FILE))
    except (ShardexError, OSError, ValueError):  # none, or unreadable
        record = None
    named = record.get("backends") if isinstance(record, dict) else None
    if record is not None and not (
        isinstance(named, list) and all(isinstance(n, str) for n in named)
    ):
        return None  # a run of an earlier version at work: it did not say
    if committed is None and named is None:
        return None
    return list(dict.fromkeys([*([committed] if committed else []), *(named or [])]))


def _committed_backend(storage: Storage) -> str | None:
    config = _committed(storage)
    return None if config is None else config.backend


def _committed(storage: Storage) -> ExportConfig | None:
    try:
        return ExportConfig.from_yaml(storage.get(CONFIG_FILE), where=CONFIG_FILE)
    except (ShardexError, OSError):  # none, or unreadable: every backend is asked anyway
        return None
