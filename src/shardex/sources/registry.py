"""The source registry: entries ``(name, "module:Class", probe)`` probed in order, the first
yes wins (its class imported only then). Plugins (``shardex.sources`` entry points or
:func:`register_source`) are probed first: the built-in folder takes any folder or URL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shardex.errors import SourceError
from shardex.plugins import Plugins
from shardex.sources import probe
from shardex.sources.base import Source
from shardex.sources.probe import SourceSpec

__all__ = ["ENTRY_POINT_GROUP", "REGISTRY", "SourceEntry", "open_source", "register_source"]

ENTRY_POINT_GROUP: Final = "shardex.sources"

Probe = Callable[[SourceSpec], bool]


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """A registered source, not yet imported; ``probe`` None asks the class's own."""

    name: str
    target: str
    probe: Probe | None = None
    origin: str = "built-in"


_BUILTINS: Final = (  # the order of the sniffing chain they replace: keep it
    SourceEntry("demo", "shardex.sources.demo:DemoSource", probe.demo),
    SourceEntry("table", "shardex.sources.table:TableSource", probe.table),
    SourceEntry("export", "shardex.sources.export:ExportSource", probe.export),
    SourceEntry("hf", "shardex.sources.hf:HFSource", probe.hf),
    SourceEntry("arrays", "shardex.sources.arrays:ArraySource", probe.arrays),
    SourceEntry("tars", "shardex.sources.tars:TarSource", probe.tars),
    SourceEntry("folder", "shardex.sources.folder:FolderSource", probe.folder),
)


class Registry:
    """Name -> source entry. One instance, :data:`REGISTRY`, serves the package."""

    def __init__(self, entries: tuple[SourceEntry, ...] = _BUILTINS) -> None:
        self._entries = {e.name: e for e in entries}
        self._plugin_names: list[str] = []
        self._plugins = Plugins("source", ENTRY_POINT_GROUP, SourceError)

    def register(
        self, name: str, target: str, probe: Probe | None = None, *, origin: str = "register_source"
    ) -> None:
        """Add a source by ``"module:Class"``, probed before the built-ins (with ``probe``,
        else the class's). Raises SourceError if the name is taken.
        """
        self._plugins.check_new(name, target, self._entries)
        self._entries[name] = SourceEntry(name, target, probe, origin)
        self._plugin_names.append(name)

    def entries(self) -> list[SourceEntry]:
        """Every registered source, in probe order."""
        for name, target, origin in self._plugins.entry_points():
            self.register(name, target, origin=origin)
        plugins = [self._entries[n] for n in self._plugin_names]
        return plugins + [e for e in self._entries.values() if e.origin == "built-in"]

    def source_class(self, entry: SourceEntry) -> type[Source]:
        """The class of an entry (imported now).

        Raises:
            SourceError: its module fails to import, or its target is not a Source.
        """
        cls: type[Source] = self._plugins.load(entry.name, entry.target, entry.origin, Source)
        return cls

    def open(self, spec: SourceSpec) -> Source:
        """The source of the first entry whose probe takes ``spec``.

        Raises:
            SourceError: no source reads it (SourceNotFoundError: a missing path), or a plugin
                fails to import.
        """
        for entry in self.entries():
            probe = entry.probe or self.source_class(entry).probe
            if probe(spec):
                return self.source_class(entry).from_spec(spec)
        raise spec.nothing_matched()


REGISTRY: Final = Registry()


def register_source(name: str, target: str, probe: Probe | None = None) -> None:
    """Register a source under ``name``; see :meth:`Registry.register`."""
    REGISTRY.register(name, target, probe)


def open_source(
    spec: str | Any | Source | Mapping[str, Any], storage_options: dict[str, Any] | None = None
) -> Source:
    """The source a user names (``storage_options``: those of a source on object
    storage, see :class:`shardex.storage.ObjectStorage`).

    * ``demo`` or ``demo:N``: the built-in demo dataset (N images, default 5000);
    * a folder with ``config.yaml``: an existing shardex export;
    * a folder holding only ``.tar`` files, a ``.tar`` file, or a glob: WebDataset tars;
    * any other folder: an image folder;
    * a ``.parquet``/``.csv``/``.tsv`` file: a table of paths or bytes plus metadata;
    * a mapping of names to arrays: in-memory arrays (see :class:`ArraySource`);
    * a Hugging Face ``Dataset``/``DatasetDict``, or a folder ``save_to_disk`` wrote;
    * an object-store URL (``s3://bucket/prefix``): an export (it holds ``config.yaml``),
      a ``.tar``, a glob or a prefix of only ``.tar`` objects (WebDataset tars), a
      ``.parquet``/``.csv`` table, else an image folder;
    * whatever an installed plugin source claims (``shardex.sources`` entry points,
      asked first).
    """
    if isinstance(spec, Source):
        return spec
    return REGISTRY.open(SourceSpec(spec, storage_options))
