"""Which files of an output shardex wrote: the export's own files, and what each backend
declares it writes (:attr:`Backend.files <shardex.backends.base.Backend.files>`).

An overwrite or a resume replaces only what shardex wrote; anything else in the output
means the user pointed shardex at the wrong folder, and the export is refused. A plugin
backend's files count as shardex's as soon as it is registered.

Backends are asked lazily, cheapest first: the one config.yaml names, then those already
imported (the one being exported with), then the others, so a folder holding one
backend's export does not import every backend's dependencies (torch, zarr) to be checked.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from typing import Final

from shardex.backends.base import Backend
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
    export itself nor any registered backend writes."""
    rest = [p for p in paths if _EXPORT_FILES.fullmatch(p) is None]
    for backend in _backends(storage) if rest else iter(()):
        rest = [p for p in rest if not backend.owns(p)]
        if not rest:
            break
    return rest


def shardex_files(storage: Storage, paths: Iterable[str]) -> list[str]:
    """The ``paths`` that the export or a registered backend writes, in their order."""
    paths = list(paths)
    foreign = set(foreign_files(storage, paths))
    return [p for p in paths if p not in foreign]


def _backends(storage: Storage) -> Iterator[type[Backend]]:
    """Backend classes in the order to ask them (see the module docstring); a backend
    whose dependencies are missing cannot have written anything here and is passed over."""
    names = [e.name for e in REGISTRY.entries()]
    committed = _committed_backend(storage)
    imported = [n for n in names if _module_of(n) in sys.modules]
    cheap = [e.name for e in REGISTRY.entries() if not e.requires and e.available]
    dear = [e.name for e in REGISTRY.entries() if e.requires and e.available]
    first = [committed] if committed in names else []
    for name in dict.fromkeys([*first, *imported, *cheap, *dear]):
        try:
            yield REGISTRY.backend_class(name)
        except ShardexError:  # a dependency missing, or a broken plugin: it wrote nothing
            continue


def _module_of(name: str) -> str:
    entry = next(e for e in REGISTRY.entries() if e.name == name)
    return entry.target.partition(":")[0]


def _committed_backend(storage: Storage) -> str | None:
    try:
        return ExportConfig.from_yaml(storage.get(CONFIG_FILE), where=CONFIG_FILE).backend
    except (ShardexError, OSError):  # none, or unreadable: every backend is asked anyway
        return None
