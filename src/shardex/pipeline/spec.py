"""Spec files: the reproducible form of an export, validated against a shipped schema.

See docs/pipeline.md, "Spec files". A bare name is a *scenario*: ``NAME.yaml`` in the
current folder or ``SHARDEX_SCENARIO_PATH``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from shardex.contract import ExportConfig
from shardex.errors import ConfigError, SchemaError, ShardexError, SourceNotFoundError
from shardex.pipeline.executors import Executor, LocalExecutor
from shardex.pipeline.pipeline import Pipeline
from shardex.pipeline.readers import ReaderStage
from shardex.pipeline.stage import Stage
from shardex.pipeline.writer import ImageWriterStage
from shardex.quoting import collapsed

#: Folders (``os.pathsep``-separated) searched for NAME.yaml after the current folder.
SCENARIO_PATH: Final = "SHARDEX_SCENARIO_PATH"
_SPEC_SUFFIXES: Final = (".yaml", ".yml")

#: Keys and options that say where and how to run, not what to produce.
_NOT_FINGERPRINTED = ("output", "executor", "name")
_NOT_OUTPUT = frozenset({"mode", "overwrite", "verbose", "workers", "storage_options"})


@dataclass(frozen=True, slots=True)
class Spec:
    """A parsed, validated spec file."""

    raw: dict[str, Any]
    where: str = "spec"
    stages: tuple[dict[str, Any], ...] = field(default=())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Spec:
        """Read and validate a YAML spec file."""
        try:
            text = Path(path).read_text("utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read spec {path}: {exc.strerror}") from exc
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SchemaError(f"{path}: not valid YAML ({collapsed(exc)})") from exc
        return cls.parse(raw, where=str(path))

    @classmethod
    def parse(cls, raw: Any, *, where: str = "spec") -> Spec:
        """Validate a spec already parsed (a dict)."""
        import fastjsonschema

        try:
            _validator()(raw)
        except fastjsonschema.JsonSchemaValueException as exc:
            text = exc.message.removeprefix("data.").removeprefix("data ")
            raise SchemaError(f"{where}: {text} (spec schema rule {exc.rule!r})") from None
        return cls(raw, where, tuple(raw.get("stages", ())))

    def fingerprint(
        self,
        preprocess: bool = True,
        until_keys: Iterable[str] = (),
        overrides: dict[str, Any] | None = None,
    ) -> str:
        """A hash of what the export's content depends on."""
        basis = {k: v for k, v in self.raw.items() if k not in _NOT_FINGERPRINTED}
        changes = {k: v for k, v in (overrides or {}).items() if k not in _NOT_OUTPUT}
        basis["_run"] = {"preprocess": preprocess, "until": sorted(until_keys), **changes}
        text = json.dumps(basis, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def export_options(self) -> dict[str, Any]:
        return {"backend": self.raw.get("backend", "webdataset"), **self.raw.get("options", {})}

    def executor(
        self, kind: str | None = None, workers: int | None = None, address: str | None = None
    ) -> Executor:
        """The executor the spec names, with command-line overrides."""
        conf = self.raw.get("executor", {})
        kind = kind or conf.get("kind", "local")
        workers = workers or conf.get("workers")
        if kind == "ray":
            from shardex.pipeline.ray_executor import RayExecutor

            return RayExecutor(address or conf.get("address"))
        return LocalExecutor(workers)

    def build_stages(self) -> list[Stage]:
        return [build_stage(entry, self.where) for entry in self.stages]

    def pipeline(
        self,
        output: str | os.PathLike[str] | None,
        fingerprint: str | None = None,
        **overrides: Any,
    ) -> Pipeline:
        """The spec as a pipeline: reader, its stages, a writer to ``output``."""
        target = output or self.raw.get("output")
        if target is None:
            raise ConfigError(f"{self.where}: no output (give `output:` in the spec or -o OUT)")
        options = {**self.export_options(), **overrides}
        backend = options.pop("backend")
        per_tar = options.pop("samples_per_shard", 1000)
        storage = options.pop("storage_options", None) or self.raw.get("storage_options")
        writer = ImageWriterStage(
            target,
            images_per_tar=per_tar,
            backend=backend,
            storage_options=storage,
            spec_fingerprint=fingerprint or self.fingerprint(),
            **options,
        )
        reader = ReaderStage(self.raw["source"], batch_size=self.raw.get("batch_size", 256))
        return Pipeline(
            self.raw.get("name", Path(self.where).stem), [reader, *self.build_stages(), writer]
        )


def is_scenario_name(source: str) -> bool:
    """Whether ``source`` can only be a scenario's name (no path, scheme, glob or file)."""
    separators = {"/", os.sep, *(os.altsep or "")}
    return (
        bool(source)
        and not any(c in source for c in (*separators, ":", "*", "?", "["))
        and not os.path.lexists(source)
    )


def scenario_places(name: str) -> list[Path]:
    folders = [Path.cwd()]
    folders += [Path(p) for p in os.environ.get(SCENARIO_PATH, "").split(os.pathsep) if p]
    return [folder / f"{name}{suffix}" for folder in folders for suffix in _SPEC_SUFFIXES]


def find_scenario(source: str) -> Path | None:
    """The spec file ``source`` names (a YAML path, or a scenario's); None if none."""
    if source.endswith(_SPEC_SUFFIXES):
        return Path(source)
    if not is_scenario_name(source):
        return None
    return next((p for p in scenario_places(source) if p.is_file()), None)


def scenario_not_found(name: str) -> SourceNotFoundError:
    folders = dict.fromkeys(str(p.parent) for p in scenario_places(name))
    return SourceNotFoundError(
        f"source {name!r} is no file, folder or built-in source, and no scenario "
        f"{name}.yaml or {name}.yml is in {', '.join(folders)} (the current folder, then "
        f"{SCENARIO_PATH})"
    )


@cache
def _validator() -> Any:
    import fastjsonschema

    text = resources.files("shardex").joinpath("schema/spec.schema.json").read_text("utf-8")
    return fastjsonschema.compile(json.loads(text))


@cache
def builtin_stages() -> dict[str, type[Stage]]:
    from shardex.pipeline.stages import BUILTIN_STAGES

    return BUILTIN_STAGES


def build_stage(entry: dict[str, Any], where: str = "spec") -> Stage:
    """A stage from its spec entry: ``{stage: NAME or module:Class, **kwargs}``."""
    args = {k: v for k, v in entry.items() if k != "stage"}
    name = entry["stage"]
    cls: Any = builtin_stages().get(name)
    if cls is None and ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{where}: cannot import stage {name!r} ({exc})") from exc
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        known = ", ".join(sorted(builtin_stages()))
        raise ConfigError(
            f"{where}: unknown stage {name!r} (built-in stages: {known}; or module:Class)"
        )
    try:
        return cls(**args)
    except TypeError as exc:
        raise ConfigError(f"{where}: stage {name!r}: {exc}") from exc


def run_spec(
    spec: Spec | str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    executor: Executor | None = None,
    preprocess: bool = True,
    until_keys: Iterable[str] = (),
    **overrides: Any,
) -> ExportConfig:
    """Export as a spec says.

    Args:
        preprocess: run the spec's stages (False: export the source as is).
        until_keys: run stages only until these keys exist; they are stored as features.
        overrides: export options on top of the spec's.
    """
    spec = load_spec(spec)
    until = tuple(until_keys)
    preprocess = preprocess or bool(until)
    fingerprint = spec.fingerprint(preprocess, until, overrides)
    if until:
        overrides = {**overrides, "with_keys": until}
    pipeline = spec.pipeline(output, fingerprint, **overrides)
    if not preprocess:
        pipeline.stages = [pipeline.stages[0], pipeline.stages[-1]]
    made = executor is None  # a caller's executor is the caller's to close
    executor = executor or spec.executor()
    try:
        return pipeline.run(executor, until_keys=until)
    finally:
        if made:
            executor.close()


def materialize(
    spec: Spec | str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    executor: Executor | None = None,
    until_keys: Iterable[str] = (),
) -> ExportConfig:
    """The export ``spec`` describes at ``output``: reused if its fingerprint matches, else rebuilt."""
    from shardex.api import read_config

    spec = load_spec(spec)
    target = output or spec.raw.get("output")
    if target is None:
        raise ConfigError(f"{spec.where}: no output (give `output:` in the spec or an output)")
    try:
        existing = read_config(os.fspath(target))
    except ShardexError:
        existing = None
    until = tuple(until_keys)
    if existing is not None and existing.spec_fingerprint == spec.fingerprint(True, until):
        return existing
    return run_spec(spec, target, executor=executor, until_keys=until, mode="overwrite")


def load_spec(spec: Spec | str | os.PathLike[str]) -> Spec:
    """A spec, a spec file's path or a scenario's name, loaded."""
    if isinstance(spec, Spec):
        return spec
    found = find_scenario(os.fspath(spec))
    if found is None and is_scenario_name(os.fspath(spec)):
        raise scenario_not_found(os.fspath(spec))
    return Spec.load(found or spec)
