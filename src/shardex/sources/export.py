"""An existing shardex export as a source: splits, labels, keys and metadata are kept.

Every sample is checked against the source export's checksums as it is read, so damage
in the source is never copied into a new export that would then verify: a damaged sample
is marked invalid (``_invalid``), and the export refuses it with a one-line error naming
the source shard and sample, or skips it into ``errors.parquet`` under
``on_error="skip"``.

The export's backend says how its samples are read again
(:meth:`~shardex.backends.Backend.stored_samples`): a local ``webdataset`` export is read
once, shard by shard, through its sample index, each sample checked against its checksum
and its members described as byte ranges of the source tar, read again only when the new
shards are written (memory stays bounded whatever the export's size). Any other export is
read through :func:`shardex.open_dataset` (which checks what it reads), its fields held in
memory until written; samples its dataset would not catch as damaged
(:meth:`~shardex.backends.Backend.damaged_samples`: array runs whose reader does not check
their bytes) are checked against config.yaml first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

import pyarrow as pa

from shardex.backends.registry import backend_for
from shardex.contract import METADATA_FILE, ExportConfig
from shardex.errors import FormatError, ShardexError, SourceError
from shardex.sources.base import MEMBERS, RESERVED, ScanResult, Source, build_table
from shardex.storage import Storage, open_storage

if TYPE_CHECKING:
    from shardex.dataset import Dataset

#: Fields that come back from metadata.parquet rather than from the samples.
_FROM_METADATA: Final = ("cls", "json")


@dataclass
class _Samples:
    """One split's samples: keys, members, and why each damaged one cannot be used."""

    keys: list[str] = field(default_factory=list)
    members: list[list[dict[str, Any]]] = field(default_factory=list)
    invalid: list[str | None] = field(default_factory=list)

    def add(self, key: str, members: list[dict[str, Any]], invalid: str | None = None) -> None:
        self.keys.append(key)
        self.members.append([m for m in members if m["ext"] not in _FROM_METADATA])
        self.invalid.append(invalid)


class ExportSource(Source):
    """Samples of a committed export, every split, with their metadata."""

    kind: ClassVar[str] = "shardex-export"

    def __init__(
        self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> None:
        self.uri = os.fspath(root)
        self.storage_options = storage_options

    def scan(self) -> ScanResult:
        from shardex.api import read_config

        storage = open_storage(self.uri, self.storage_options)
        config = read_config(storage)
        parts = [self._split(storage, config, split) for split in config.splits]
        keys = [k for p in parts for k in p[0].keys]
        members = [m for p in parts for m in p[0].members]
        invalid = [r for p in parts for r in p[0].invalid]
        meta = pa.concat_tables([p[1] for p in parts])
        labels = meta.column("label").to_pylist() if "label" in meta.column_names else None
        user = meta.drop_columns([c for c in meta.column_names if c in RESERVED or c == MEMBERS])
        table = build_table(
            keys,
            meta.column("original_path").to_pylist(),
            members,
            splits=meta.column("split").to_pylist(),
            labels=labels,
            metadata=user,
            invalid=invalid,
        )
        return ScanResult(table, config.label_names)

    def _split(
        self, storage: Storage, config: ExportConfig, split: str
    ) -> tuple[_Samples, pa.Table]:
        from shardex.api import open_dataset

        ds = open_dataset(storage, split=split, on_error="skip")
        meta = _metadata(ds, storage, config)
        wanted = meta.column("key").to_pylist()
        backend = backend_for(config)
        stored = backend.stored_samples(ds, wanted)
        if stored is not None:
            samples = _Samples()
            for sample in stored:
                samples.add(sample.key, sample.members, sample.invalid)
        else:
            damaged = backend.damaged_samples(storage, config, split)
            samples = _dataset_samples(ds, damaged, wanted)
        good = [k for k, bad in zip(samples.keys, samples.invalid, strict=True) if bad is None]
        if len(samples.keys) != len(wanted) or good != [
            k for k, bad in zip(wanted, samples.invalid, strict=True) if bad is None
        ]:
            raise SourceError(
                f"{self.uri}: split {split!r}: the shards and {_metadata_name(config)} list "
                "different samples (the export is damaged; run shardex verify)"
            )
        # keys of damaged samples come from the metadata: their bytes cannot be trusted
        samples.keys = wanted
        return samples, meta


def _metadata_name(config: ExportConfig) -> str:
    return config.metadata_file or METADATA_FILE


def _metadata(ds: Dataset, storage: Storage, config: ExportConfig) -> pa.Table:
    """The split's metadata.parquet rows, or a one-line error naming the file."""
    where = storage.join(_metadata_name(config))
    try:
        meta: pa.Table = ds.metadata
    except FormatError as exc:  # damaged (its checksum): a source that cannot be read as asked
        raise SourceError(f"the source export's {exc}; run shardex verify") from exc
    except ShardexError:
        raise
    except (OSError, pa.ArrowException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = repr(first)[1:-1]  # pyarrow may quote the damaged bytes themselves
        raise SourceError(
            f"cannot read {where} of the source export ({detail}); the file is damaged "
            "(run shardex verify)"
        ) from exc
    missing = [c for c in ("key", "original_path", "split") if c not in meta.column_names]
    if missing:
        raise SourceError(f"{where} of the source export lacks the column(s) {missing}")
    return meta


def _dataset_samples(ds: Dataset, damaged: dict[int, str], wanted: list[str]) -> _Samples:
    """Read every sample through the dataset (which checks what it reads), held in memory;
    samples it skips as damaged come back invalid, with its message, as do the ``damaged``
    ones (sample number -> reason)."""
    read = [dict(sample) for sample in ds]
    skipped = {
        number: f"source sample {number}: {message}"
        for number, message in ds.skipped  # type: ignore[attr-defined]
    }
    out = _Samples()
    got = iter(read)
    for number, key in enumerate(wanted):
        reason = skipped.get(number)
        if reason is not None:
            out.add(key, [], reason)
            continue
        sample = next(got, None)
        if sample is None:
            break
        members = [
            {"ext": name, "path": None, "offset": -1, "size": len(v), "data": v}
            for name, v in sample.items()
            if name != "__key__"
        ]
        out.add(str(sample["__key__"]), members, damaged.get(number))
    if next(got, None) is not None:  # more samples than the metadata lists
        out.add("", [])
    return out
