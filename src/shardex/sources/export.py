"""An existing shardex export as a source: splits, labels, keys and metadata are kept.

Every sample is checked against the source export's checksums as it is read, so damage
in the source is never copied into a new export that would then verify: a damaged sample
is marked invalid (``_invalid``), and the export refuses it with a one-line error naming
the source shard and sample, or skips it into ``errors.parquet`` under
``on_error="skip"``.

A local ``webdataset`` export is read once, shard by shard, through its sample index: each
sample's bytes are checked against its per-sample checksum and its members become byte
ranges of the source tar, read again only when the new shards are written (memory stays
bounded whatever the export's size). Any other export, of any backend or on object
storage, is read through :func:`shardex.open_dataset` (which checks what it reads), its
fields held in memory until written; array runs whose reader does not check their bytes
(``numpy``, ``numpy_mmap``, ``tensordict_memmap``) are checked against their run checksum
in config.yaml first.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

import pyarrow as pa

from shardex.backends.registry import backend_for
from shardex.contract import METADATA_FILE, ExportConfig
from shardex.errors import FormatError, ShardexError, SourceError
from shardex.image_member import IMAGE_FORMAT, original_extension
from shardex.sources.base import (
    DEFAULT_BATCH_SIZE,
    MEMBERS,
    RESERVED,
    SampleStream,
    ScanBatch,
    Source,
    batch_table,
    check_batch_size,
    members_array,
)
from shardex.storage import Storage, open_storage

if TYPE_CHECKING:
    from shardex.dataset import Dataset

#: Fields that come back from metadata.parquet rather than from the samples.
_FROM_METADATA: Final = ("cls", "json")


#: A sample as a re-export reads it: its key, its members (``ext``, ``path``, ``offset``,
#: ``size``, ``data``) and why it cannot be used (None when it can).
_Sample = tuple[str, list[dict[str, Any]], str | None]


@dataclass
class _Samples:
    """Some samples of a split, column by column: keys, members, and why each damaged one
    cannot be used."""

    keys: list[str] = field(default_factory=list)
    invalid: list[str | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=lambda: [0])
    ext: list[str] = field(default_factory=list)
    path: list[str | None] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    data: list[bytes | None] = field(default_factory=list)

    def add(self, key: str, members: list[dict[str, Any]], invalid: str | None = None) -> None:
        self.keys.append(key)
        self.invalid.append(invalid)
        for m in members:
            if m["ext"] not in _FROM_METADATA:
                self.ext.append(m["ext"])
                self.path.append(m["path"])
                self.offset.append(m["offset"])
                self.size.append(m["size"])
                self.data.append(m["data"])
        self.offsets.append(len(self.ext))

    def restore_images(self, member: str, formats: list[str | None]) -> None:
        """Give each sample's image stored as ``KEY.<member>`` (``image_member``) its own
        format's extension back, from its ``image_format`` metadata: a re-export sees the
        source's files as they were, whatever options it is made with."""
        for i, image_format in enumerate(formats):
            for m in range(self.offsets[i], self.offsets[i + 1]):
                if self.ext[m] == member:
                    self.ext[m] = original_extension(image_format, member)

    def members(self) -> pa.Array:
        """The ``_members`` column."""
        data = self.data if any(d is not None for d in self.data) else None
        return members_array(self.offsets, self.ext, self.path, self.offset, self.size, data)


class ExportSource(Source):
    """Samples of a committed export, every split, with their metadata."""

    kind: ClassVar[str] = "shardex-export"

    def __init__(
        self,
        root: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.uri = os.fspath(root)
        self.storage_options = storage_options
        self.batch_size = check_batch_size(batch_size)

    def stream(self) -> SampleStream:
        from shardex.api import read_config

        storage = open_storage(self.uri, self.storage_options)
        config = read_config(storage)
        return SampleStream(self._batches(storage, config), config.label_names)

    def _batches(self, storage: Storage, config: ExportConfig) -> Iterator[ScanBatch]:
        for split in config.splits:
            yield from self._split(storage, config, split)

    def _split(self, storage: Storage, config: ExportConfig, split: str) -> Iterator[ScanBatch]:
        """A split's samples in batches, checked against its metadata rows as they come."""
        from shardex.api import open_dataset

        ds = open_dataset(storage, split=split, on_error="skip")
        meta = _metadata(ds, storage, config)
        wanted = meta.column("key").to_pylist()
        backend = backend_for(config)
        stored = backend.stored_samples(ds, wanted)
        samples = (
            ((s.key, s.members, s.invalid) for s in stored)
            if stored is not None
            else _dataset_samples(ds, backend.damaged_samples(storage, config, split), wanted)
        )
        member = config.shard_options.get("image_member")
        if IMAGE_FORMAT not in meta.column_names:
            member = None
        start = 0
        for chunk in _chunks(samples, self.batch_size):
            rows = len(chunk.keys)
            expected = wanted[start : start + rows]
            good = [k for k, bad in zip(chunk.keys, chunk.invalid, strict=True) if bad is None]
            if len(expected) != rows or good != [
                k for k, bad in zip(expected, chunk.invalid, strict=True) if bad is None
            ]:
                raise self._different(config, split)
            # keys of damaged samples come from the metadata: their bytes cannot be trusted
            chunk.keys = expected
            rows_meta = meta.slice(start, rows)
            if member is not None:
                chunk.restore_images(member, rows_meta.column(IMAGE_FORMAT).to_pylist())
                # shardex's own column, not the user's: an image_member re-export adds it again
                rows_meta = rows_meta.drop_columns([IMAGE_FORMAT])
            yield ScanBatch(_table(chunk, rows_meta))
            start += rows
        if start != len(wanted):
            raise self._different(config, split)

    def _different(self, config: ExportConfig, split: str) -> SourceError:
        return SourceError(
            f"{self.uri}: split {split!r}: the shards and {_metadata_name(config)} list "
            "different samples (the export is damaged; run shardex verify)"
        )


def _chunks(samples: Iterator[_Sample], size: int) -> Iterator[_Samples]:
    chunk = _Samples()
    for key, members, invalid in samples:
        chunk.add(key, members, invalid)
        if len(chunk.keys) >= size:
            yield chunk
            chunk = _Samples()
    if chunk.keys:
        yield chunk


def _table(samples: _Samples, meta: pa.Table) -> pa.Table:
    """A batch's scan table: the samples' members, the rest from their metadata rows."""
    user = meta.drop_columns([c for c in meta.column_names if c in RESERVED or c == MEMBERS])
    return batch_table(
        samples.keys,
        meta.column("original_path"),
        samples.members(),
        splits=meta.column("split"),
        labels=meta.column("label") if "label" in meta.column_names else None,
        metadata=user,
        invalid=samples.invalid,
    )


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


def _dataset_samples(ds: Dataset, damaged: dict[int, str], wanted: list[str]) -> Iterator[_Sample]:
    """Read every sample through the dataset (which checks what it reads), held in memory;
    samples it skips as damaged come back invalid, with its message, as do the ``damaged``
    ones (sample number -> reason)."""
    read = [dict(sample) for sample in ds]
    skipped = {
        number: f"source sample {number}: {message}"
        for number, message in ds.skipped  # type: ignore[attr-defined]
    }
    got = iter(read)
    for number, key in enumerate(wanted):
        reason = skipped.get(number)
        if reason is not None:
            yield key, [], reason
            continue
        sample = next(got, None)
        if sample is None:
            break
        members = [
            {"ext": name, "path": None, "offset": -1, "size": len(v), "data": v}
            for name, v in sample.items()
            if name != "__key__"
        ]
        yield str(sample["__key__"]), members, damaged.get(number)
    if next(got, None) is not None:  # more samples than the metadata lists
        yield "", [], None
