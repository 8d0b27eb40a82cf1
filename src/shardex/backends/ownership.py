"""Which files of an output shardex wrote, so an overwrite or resume never touches a
foreign file (the export is refused instead).

Top-level files count as a backend's only where a flat export is committed or a run's
intent file says ``top_level``: a NeMo Curator output's ``images-{hash}-000000.tar`` is
named like a flat shard. Only the backends that wrote the output (config.yaml's, and the
intent file's ``backends``) may own files; with neither recorded, any may. Backends are
asked cheapest first, so checking a folder does not import torch or zarr needlessly.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from typing import Any, Final

from shardex.backends.registry import REGISTRY
from shardex.contract import CONFIG_FILE, ExportConfig
from shardex.errors import ShardexError
from shardex.storage.base import Storage

#: The export's own files (``.pending``: left by versions that renamed after committing).
_EXPORT_FILES: Final = re.compile(
    r"config\.yaml|\.shardex-intent\.json|\.shardex-lock"
    r"|metadata(?:\.pending|\.2)?\.parquet|errors(?:\.2)?\.parquet"
)


def foreign_files(storage: Storage, paths: Iterable[str]) -> list[str]:
    """The ``paths`` (relative to the root) that neither the export nor a backend writes.

    Raises:
        BackendError, MissingDependencyError: some paths are unclaimed and the committed
            backend is not available here to claim them.
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
    """Whether the export ``config`` describes writes ``path``."""
    return run_owns(config.backend, config.flat, path)


def run_owns(backend: str, flat: bool, path: str) -> bool:
    """Whether an export with ``backend`` writes ``path`` (``flat``: top-level files too)."""
    if _EXPORT_FILES.fullmatch(path) is not None:
        return True
    if "/" not in path and not flat:
        return False
    try:
        return REGISTRY.backend_class(backend).owns(path)
    except ShardexError:  # not installed here: its files cannot be told
        return False


def _top_level_ours(storage: Storage, paths: list[str]) -> bool:
    if INTENT_FILE in paths:
        record = _intent(storage)
        if isinstance(record, dict) and record.get("top_level") is True:
            return True
    return CONFIG_FILE in paths and committed_is_flat(storage)


def committed_is_flat(storage: Storage) -> bool:
    """Whether the output holds a committed export with ``layout: flat``."""
    config = _committed(storage)
    return config is not None and config.flat


def _owned(storage: Storage, rest: list[str], owners: list[str] | None) -> list[str]:
    """The ``rest`` that none of ``owners`` (None: any registered backend) writes."""
    if not rest:
        return rest
    committed = _committed_backend(storage)
    unknown: ShardexError | None = None
    for name in _order(committed) if owners is None else owners:
        try:
            backend = REGISTRY.backend_class(name)
        except ShardexError as exc:  # not installed, or a plugin that fails to import
            unknown = exc if name == committed or owners is not None else unknown
            continue
        rest = [p for p in rest if not backend.owns(p)]
        if not rest:
            return rest
    if unknown is not None:
        raise unknown
    return rest


#: What a writer records before it writes anything (see
#: :func:`shardex.engine.output.record_intent`).
INTENT_FILE: Final = ".shardex-intent.json"


def shardex_files(storage: Storage, paths: Iterable[str]) -> list[str]:
    """The ``paths`` that the export or a registered backend writes, in their order."""
    paths = list(paths)
    foreign = set(foreign_files(storage, paths))
    return [p for p in paths if p not in foreign]


def _order(committed: str | None) -> list[str]:
    """Backend names, cheapest to ask first."""
    entries = REGISTRY.entries()
    imported = [e.name for e in entries if e.target.partition(":")[0] in sys.modules]
    cheap = [e.name for e in entries if not e.requires and e.available]
    dear = [e.name for e in entries if e.requires and e.available]
    first = [committed] if committed is not None else []
    return list(dict.fromkeys([*first, *imported, *cheap, *dear]))


def writers(storage: Storage) -> list[str] | None:
    """The backends whose files the output may hold; None when it does not say."""
    committed = _committed_backend(storage)
    record = _intent(storage)
    named = record.get("backends") if isinstance(record, dict) else None
    if record is not None and not (
        isinstance(named, list) and all(isinstance(n, str) for n in named)
    ):
        return None  # a run of an earlier version
    if committed is None and named is None:
        return None
    return list(dict.fromkeys([*([committed] if committed else []), *(named or [])]))


def _intent(storage: Storage) -> Any:
    try:
        return json.loads(storage.get(INTENT_FILE))
    except (ShardexError, OSError, ValueError):  # none, or unreadable
        return None


def _committed_backend(storage: Storage) -> str | None:
    config = _committed(storage)
    return None if config is None else config.backend


def _committed(storage: Storage) -> ExportConfig | None:
    try:
        return ExportConfig.from_yaml(storage.get(CONFIG_FILE), where=CONFIG_FILE)
    except (ShardexError, OSError):  # none, or unreadable
        return None
