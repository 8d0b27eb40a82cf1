"""The backend registry: lazy ``"module:Class"`` entries, built-in or from the
``shardex.backends`` entry-point group; a name registered twice raises, a missing
dependency names its extra."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from shardex.backends.base import Backend
from shardex.contract import ExportConfig
from shardex.errors import BackendError, ConfigError, MissingDependencyError, ShardexError
from shardex.plugins import Plugins

if TYPE_CHECKING:
    from shardex.options import ExportOptions

ENTRY_POINT_GROUP: Final = "shardex.backends"


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """A registered backend, not yet imported."""

    name: str
    target: str
    requires: tuple[str, ...] = ()
    install_hint: str | None = None
    origin: str = "built-in"

    @property
    def available(self) -> bool:
        """Whether its optional dependencies are importable (without importing them)."""
        return all(importlib.util.find_spec(mod) is not None for mod in self.requires)


def _extra(name: str, target: str, extra: str) -> BackendEntry:
    """A built-in that needs the package ``extra``, installed by the extra of that name."""
    return BackendEntry(name, target, (extra,), f"pip install 'shardex[{extra}]'")


_BUILTINS: Final = (
    BackendEntry("webdataset", "shardex.backends.webdataset:WebDatasetBackend"),
    BackendEntry("numpy", "shardex.backends.numpy_files:NumpyBackend"),
    BackendEntry("numpy_mmap", "shardex.backends.numpy_mmap:NumpyMmapBackend"),
    BackendEntry("tensor_shards", "shardex.backends.tensor_shards:TensorShardsBackend"),
    _extra("torch", "shardex.backends.torch_files:TorchBackend", "torch"),
    _extra(
        "tensordict_memmap", "shardex.backends.tensordict_memmap:TensorDictBackend", "tensordict"
    ),
    _extra("zarr", "shardex.backends.zarr_store:ZarrBackend", "zarr"),
)


class Registry:
    """Name -> backend entry (one instance: :data:`REGISTRY`)."""

    def __init__(self, entries: tuple[BackendEntry, ...] = _BUILTINS) -> None:
        self._entries = {e.name: e for e in entries}
        self._plugins = Plugins("backend", ENTRY_POINT_GROUP, BackendError)

    def _load_plugins(self) -> None:
        for name, target, origin in self._plugins.entry_points():
            self.register(name, target, origin=origin)

    def register(
        self,
        name: str,
        target: str,
        *,
        requires: tuple[str, ...] = (),
        install_hint: str | None = None,
        origin: str = "register_backend",
    ) -> None:
        """Add a backend by ``"module:Class"``. Raises BackendError if the name is taken."""
        self._plugins.check_new(name, target, self._entries)
        self._entries[name] = BackendEntry(name, target, requires, install_hint, origin)

    def entries(self) -> list[BackendEntry]:
        """Every registered backend, sorted by name."""
        self._load_plugins()
        return sorted(self._entries.values(), key=lambda e: e.name)

    def get(self, name: str, options: Mapping[str, Any] | None = None) -> Backend:
        """An instance of the named backend (with its backend options)."""
        return self.backend_class(name)(options)

    def backend_class(self, name: str) -> type[Backend]:
        """The class of the named backend (imported now).

        Raises:
            BackendError: no backend has this name, its module fails to import, or its
                target is not a Backend.
            MissingDependencyError: it needs a package that is not installed.
        """
        # Entry points cost ~20 ms: read only for a name not registered yet.
        entry = self._entries.get(name)
        if entry is None:
            self._load_plugins()
            entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self._entries))
            raise BackendError(f"unknown backend {name!r}; known backends: {known}")
        module_name = entry.target.partition(":")[0]
        hint = entry.install_hint or f"install the package that provides {module_name}"
        # refused before any work even where the backend imports its dependency lazily
        missing = [m for m in entry.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingDependencyError(
                f"backend {name!r} needs a missing dependency ({missing[0]}): {hint}"
            )

        def not_installed(exc: ImportError) -> Exception:
            return MissingDependencyError(
                f"backend {name!r} needs a missing dependency ({exc.name}): {hint}"
            )

        cls: type[Backend] = self._plugins.load(
            name, entry.target, entry.origin, Backend, not_installed
        )
        return cls


REGISTRY: Final = Registry()


def register_backend(
    name: str, target: str, *, requires: tuple[str, ...] = (), install_hint: str | None = None
) -> None:
    """Register a backend under ``name``; see :class:`Registry.register`."""
    REGISTRY.register(name, target, requires=requires, install_hint=install_hint)


def get_backend(name: str, options: Mapping[str, Any] | None = None) -> Backend:
    """The backend registered under ``name``, configured with ``options``."""
    return REGISTRY.get(name, options)


def backend_for(config: ExportConfig) -> Backend:
    """The backend of a committed export, with the options it was written with."""
    return REGISTRY.get(config.backend, config.shard_options.get("backend_options"))


def check_options(opts: ExportOptions) -> None:
    """Refuse ``dtype="bfloat16"`` before any work where the backend cannot store it."""
    backend = opts.backend
    if opts.dtype != "bfloat16" or REGISTRY.backend_class(backend).capabilities.bfloat16:
        return
    able = []
    for entry in REGISTRY.entries():
        if entry.available:
            try:
                if REGISTRY.backend_class(entry.name).capabilities.bfloat16:
                    able.append(entry.name)
            except ShardexError:  # a broken plugin does not hide the answer
                continue
    raise ConfigError(
        f"the {backend} backend cannot store dtype bfloat16; use one that can "
        f"({', '.join(able) or 'none installed: pip install shardex[torch]'}) or another dtype"
    )
