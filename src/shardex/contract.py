"""The model of ``config.yaml``, its schema and (de)serialisation.

``config.yaml`` is written last and is an export's commit point; every read validates it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Literal

# The schema compiled ahead of time (scripts/gen_config_validator.py): ~15x faster than an
# interpreting validator with tens of thousands of shards, and no ~45 ms compile per process.
from shardex import config_validator, yaml_subset
from shardex.errors import ConfigError, SchemaError
from shardex.names import stored_split_name_problem
from shardex.quoting import collapsed

if TYPE_CHECKING:
    from shardex.storage.base import Storage

#: 2: per-sample checksums seeded with the sample number (format/index.py).
#: 3: ``index-members.npy`` per split, so reads slice fields without parsing tar headers.
#: Older versions still open and read.
FORMAT_VERSION: Final = 3
CONFIG_FILE: Final = "config.yaml"
METADATA_FILE: Final = "metadata.parquet"
ERRORS_FILE: Final = "errors.parquet"
LABEL_PREFIX: Final = "label__"

Role = Literal["x", "y", "meta"]
Shape = tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class KeySpec:
    """One stored key as it is on disk: ``None`` in ``shape`` where a dimension varies,
    ``storage`` where the values live (a ``tar`` member, a ``parquet`` column)."""

    key: str
    role: Role
    dtype: str
    shape: Shape | None = None
    layout: str | None = None
    encoding: str | None = None
    storage: str = "parquet"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One stored field of every sample: its member name (``jpg``, ``x.npy``), how it is
    stored, its per-sample shape (``None`` where it varies) and its array-backend column."""

    name: str
    kind: Literal["bytes", "array", "label"]
    dtype: str
    shape: tuple[int | None, ...]
    optional: bool = False
    column: str = ""


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard file of a split, its Parquet sidecar and its DALI index file, if any."""

    path: str
    num_samples: int
    num_bytes: int
    checksum: str
    metadata: str | None = None
    dali_index: str | None = None
    metadata_checksum: str | None = None


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """The random-access index files of a split (``members``: from format version 3)."""

    samples: str
    keys: str
    members: str | None = None


@dataclass(frozen=True, slots=True)
class SplitInfo:
    """One split: its sample count, shards, index, other files and key-hash table."""

    num_samples: int
    num_bytes: int
    shards: tuple[ShardInfo, ...]
    index: IndexInfo | None = None
    files: tuple[str, ...] = ()
    keys: str | None = None


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Where the exported samples came from."""

    uri: str
    kind: str
    num_samples: int
    fingerprint: str


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """Everything a reader needs to know about an export (the content of config.yaml)."""

    backend: str
    num_samples: int
    splits: dict[str, SplitInfo]
    key_specs: tuple[KeySpec, ...]
    x_keys: tuple[str, ...]
    y_keys: tuple[str, ...]
    writer: dict[str, str]
    shardex_version: str
    format_version: int = FORMAT_VERSION
    label_names: tuple[str, ...] | None = None
    num_classes: int | None = None
    modality: str = "image"
    label_prefix: str = LABEL_PREFIX
    feature_shapes: dict[str, list[int | None]] = field(default_factory=dict)
    source_datasets: tuple[SourceInfo, ...] = ()
    source_fingerprint: str = ""
    split_seed: int | None = None
    split_fractions: dict[str, float] | None = None
    split_method: str = "single"
    shard_options: dict[str, Any] = field(default_factory=dict)
    checksum_algorithm: str = "xxh3_64"
    metadata_file: str | None = METADATA_FILE
    errors_file: str | None = None
    #: Whole-file checksums of metadata_file and errors_file (None in older exports).
    metadata_checksum: str | None = None
    errors_checksum: str | None = None
    num_skipped: int = 0
    pipeline: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    fields: tuple[FieldSpec, ...] = ()
    spec_fingerprint: str | None = None

    def split(self, name: str) -> SplitInfo:
        """The named split, or a ConfigError listing the splits."""
        try:
            return self.splits[name]
        except KeyError:
            known = ", ".join(self.splits) or "none"
            raise ConfigError(f"split {name!r} is not in this export (splits: {known})") from None

    @property
    def flat(self) -> bool:
        """Whether the one split's files lie at the top level (NeMo Curator's layout)."""
        return self.shard_options.get("layout") == "flat"

    def split_prefix(self, name: str) -> str:
        """``"{name}/"``, or ``""`` when the export is :attr:`flat`."""
        return "" if self.flat else f"{name}/"

    def key_spec(self, key: str) -> KeySpec | None:
        return next((s for s in self.key_specs if s.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict in the field order of config.yaml."""
        raw = asdict(self)
        for spec in raw["key_specs"]:
            if spec["shape"] is not None:
                spec["shape"] = list(spec["shape"])
        for info in raw["splits"].values():
            info["shards"] = list(info["shards"])
            for shard in info["shards"]:
                if shard["metadata_checksum"] is None:
                    del shard["metadata_checksum"]
            info["files"] = list(info["files"])
            if not info["files"]:
                del info["files"]
            if info["keys"] is None:
                del info["keys"]
            if info["index"] is not None and info["index"]["members"] is None:
                del info["index"]["members"]
        for name in ("key_specs", "x_keys", "y_keys", "source_datasets", "pipeline", "fields"):
            raw[name] = list(raw[name])
        for spec in raw["fields"]:
            spec["shape"] = list(spec["shape"])
        if raw["label_names"] is not None:
            raw["label_names"] = list(raw["label_names"])
        order = [
            "format_version",
            "backend",
            "writer",
            "shardex_version",
            "num_samples",
            "label_names",
            "num_classes",
            "modality",
            "x_keys",
            "y_keys",
            "label_prefix",
            "feature_shapes",
            "key_specs",
            "fields",
            "source_datasets",
            "source_fingerprint",
            "split_method",
            "split_seed",
            "split_fractions",
            "shard_options",
            "checksum_algorithm",
            "metadata_file",
            "errors_file",
            "metadata_checksum",
            "errors_checksum",
            "num_skipped",
            "pipeline",
            "spec_fingerprint",
            "extra",
            "splits",
        ]
        return {name: raw[name] for name in order}

    def to_yaml(self) -> str:
        """config.yaml text, deterministic for the same config.

        Raises:
            SchemaError: the config breaks its own schema, so it is never committed.
        """
        raw = self.to_dict()
        validate(raw, where=f"{CONFIG_FILE} to be written")
        import yaml  # writers only: opening reads config.yaml with yaml_subset

        return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, width=100)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ExportConfig:
        """Build from a dict that already passed :func:`validate`."""
        splits = {
            name: SplitInfo(
                num_samples=s["num_samples"],
                num_bytes=s["num_bytes"],
                shards=tuple(ShardInfo(**shard) for shard in s["shards"]),
                index=IndexInfo(**s["index"]) if s.get("index") else None,
                files=tuple(s.get("files", ())),
                keys=s.get("keys"),
            )
            for name, s in raw["splits"].items()
        }
        specs = tuple(
            KeySpec(**{**k, "shape": None if k.get("shape") is None else tuple(k["shape"])})
            for k in raw["key_specs"]
        )
        names = raw.get("label_names")
        return cls(
            **{
                **raw,
                "splits": splits,
                "key_specs": specs,
                "x_keys": tuple(raw["x_keys"]),
                "y_keys": tuple(raw["y_keys"]),
                "label_names": None if names is None else tuple(names),
                "source_datasets": tuple(SourceInfo(**s) for s in raw.get("source_datasets", [])),
                "pipeline": tuple(raw.get("pipeline", [])),
                "fields": tuple(
                    FieldSpec(**{**f, "shape": tuple(f["shape"])}) for f in raw.get("fields", [])
                ),
            }
        )

    @classmethod
    def read(cls, storage: Storage) -> ExportConfig:
        """The config.yaml of the export in ``storage``, read and validated.

        Raises:
            NotAnExportError: there is no config.yaml.
            SchemaError: config.yaml does not match the schema.
        """
        from shardex.errors import NotAnExportError, ObjectNotFoundError

        try:
            text = storage.get(CONFIG_FILE)
        except ObjectNotFoundError:
            raise NotAnExportError(
                f"{storage.uri} is not a shardex export: it has no {CONFIG_FILE} (an export "
                "being written, or an interrupted one, has none until it commits)"
            ) from None
        return cls.from_yaml(text, where=storage.join(CONFIG_FILE))

    @classmethod
    def from_yaml(cls, text: str | bytes, *, where: str = CONFIG_FILE) -> ExportConfig:
        """Parse and validate config.yaml text."""
        try:
            # what shardex writes, without importing PyYAML (~10 ms, more than an open)
            raw = yaml_subset.load(text)
        except yaml_subset.Unsupported:
            raw = _parse_yaml(text, where)
        validate(raw, where=where)
        return cls.from_dict(raw)


def _parse_yaml(text: str | bytes, where: str) -> Any:
    import yaml

    _SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=_SafeLoader)
    except yaml.YAMLError as exc:
        raise SchemaError(f"{where}: not valid YAML ({collapsed(exc)})") from exc


@cache
def schema() -> dict[str, Any]:
    """The JSON schema (draft-07) of config.yaml shipped with the package."""
    from importlib import resources  # here: importlib.resources costs ~20 ms (tempfile)

    text = resources.files("shardex").joinpath("schema/config.schema.json").read_text("utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


def _schema_message(exc: Any) -> str:
    """A schema failure naming the field and the bad value (paths reaching outside matter)."""
    field_name = exc.name.removeprefix("data.").removeprefix("data") or "the document"
    if exc.rule == "propertyNames" and isinstance(exc.value, dict):
        for name in exc.value:
            problem = stored_split_name_problem(name)
            if problem is not None:
                return f"{field_name}: {problem}"
    if isinstance(exc.value, str):
        definition = exc.definition or {}
        described = [d for d in (definition, *definition.get("oneOf", ())) if "description" in d]
        if described:
            return f"{field_name} is {exc.value!r}, not {described[0]['description']}"
    text = exc.message.removeprefix("data.").removeprefix("data ")
    return f"{text} (schema rule {exc.rule!r})"


def validate(raw: Any, *, where: str = CONFIG_FILE) -> None:
    """Check a parsed config.yaml against the schema and its cross-field rules.

    Raises:
        SchemaError: naming the first offending field.
    """
    check: Callable[[Any], object] = config_validator.validate  # generated, untyped
    try:
        check(raw)
    except config_validator.JsonSchemaValueException as exc:
        raise SchemaError(f"{where}: {_schema_message(exc)}") from None
    total = sum(s["num_samples"] for s in raw["splits"].values())
    if total != raw["num_samples"]:
        raise SchemaError(
            f"{where}: num_samples is {raw['num_samples']} but the splits hold {total}"
        )
    for name, split in raw["splits"].items():
        in_shards = sum(s["num_samples"] for s in split["shards"])
        if in_shards != split["num_samples"]:
            raise SchemaError(
                f"{where}: split {name!r} has num_samples {split['num_samples']} but its "
                f"shards hold {in_shards}"
            )
    names = raw.get("label_names")
    if names is not None and raw.get("num_classes") not in (None, len(names)):
        raise SchemaError(
            f"{where}: num_classes is {raw['num_classes']} but label_names has {len(names)}"
        )
