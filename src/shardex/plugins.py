"""What the backend and source registries share: entries named by ``"module:Class"``,
imported only when used, and third-party ones read from an entry-point group once."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

from shardex.errors import ShardexError
from shardex.quoting import one_line

__all__ = ["Plugins"]


class Plugins:
    """A registry's names: ``kind`` names it in errors (``"backend"``), ``group`` is its
    entry-point group, ``error`` what it raises."""

    def __init__(self, kind: str, group: str, error: type[ShardexError]) -> None:
        self.kind, self.group, self.error = kind, group, error
        self._loaded = False

    def entry_points(self) -> Iterator[tuple[str, str, str]]:
        """``(name, target, origin)`` of each installed plugin, on the first call only
        (reading them costs ~10 ms)."""
        if self._loaded:
            return
        self._loaded = True
        from importlib.metadata import entry_points

        for ep in sorted(entry_points(group=self.group), key=lambda e: e.name):
            yield ep.name, ep.value, f"entry point ({ep.dist.name if ep.dist else '?'})"

    def check_new(self, name: str, target: str, taken: dict[str, Any]) -> None:
        """Refuse a name already registered, or a target that is not ``module:Class``."""
        if name in taken:
            raise self.error(
                f"{self.kind} {name!r} is already registered (by {taken[name].origin}); "
                "pick another name"
            )
        if ":" not in target:
            raise self.error(f"{self.kind} target {target!r} must look like 'module:Class'")

    def load(
        self,
        name: str,
        target: str,
        origin: str,
        base: type,
        missing: Callable[[ImportError], Exception] | None = None,
    ) -> Any:
        """The ``base`` subclass ``target`` names, imported now; an import failure is one
        line (``missing`` makes the error of an ImportError)."""
        module_name, _, cls_name = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            if missing is None:
                raise self._failed(name, module_name, origin, exc) from exc
            raise missing(exc) from exc
        except Exception as exc:  # a plugin's own bug
            raise self._failed(name, module_name, origin, exc) from exc
        cls = getattr(module, cls_name, None)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise self.error(f"{self.kind} {name!r}: {target} is not a {base.__name__} subclass")
        return cls

    def _failed(self, name: str, module: str, origin: str, exc: Exception) -> ShardexError:
        return self.error(
            f"{self.kind} {name!r}: importing {module} failed "
            f"({type(exc).__name__}: {one_line(str(exc))}); fix or uninstall {origin}"
        )
