"""An existing shardex export as a source: splits, labels, keys and metadata are kept.

Every sample is checked against the source export's checksums as it is read, so damage
in the source is never copied into a new export that would then verify: a damaged sample
is marked invalid (``_invalid``), and the export refuses it with a one-line error naming
the source shard and sample, or skips it into ``errors.parquet`` under
``on_error="skip"``.

Nothing is held for a whole split: metadata.parquet is checked against its checksum
(read in chunks; a copy on local scratch when the export is on object storage) and read
row group by row group, and the samples come in batches of at most ``batch_size`` samples.
A ``webdataset`` export (local or on object storage) is read once, shard by shard,
through its sample index: each sample's bytes are checked against its per-sample
checksum and its members become byte ranges of the source tar (or of the local copy of
what was fetched), read again only when the new shards are written. Any other export is
read through :func:`shardex.open_dataset` (which checks what it reads), its fields held
per batch (at most :data:`INLINE_BYTES` of them); array runs whose reader does not check
their bytes (``numpy``, ``numpy_mmap``, ``tensordict_memmap``) are checked against their
run checksum in config.yaml first.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardex.backends.base import StoredMember, StoredSample
from shardex.backends.registry import backend_for
from shardex.contract import METADATA_FILE, ExportConfig
from shardex.errors import FormatError, ShardexError, SourceError
from shardex.format.tables import check_local_file, metadata_errors
from shardex.image_member import IMAGE_FORMAT, original_extension
from shardex.refs.scan import MEMBERS, RESERVED, SampleStream, ScanBatch, batch_table, members_array
from shardex.sources.base import MapRunner, Source, StoredSource
from shardex.sources.probe import SourceSpec
from shardex.storage import Storage, open_storage

if TYPE_CHECKING:
    from shardex.dataset import Dataset

#: Fields that come back from metadata.parquet rather than from the samples.
_FROM_METADATA: Final = ("cls", "json")
#: The inline bytes a batch of an export read through its dataset holds at most (an array
#: backend's samples are made from its arrays: bytes, not references).
INLINE_BYTES: Final = 16 << 20


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
    inline: int = 0

    def add(self, sample: StoredSample) -> None:
        self.keys.append(sample.key)
        self.invalid.append(sample.invalid)
        for m in sample.members:
            if m.ext not in _FROM_METADATA:
                self.ext.append(m.ext)
                self.path.append(m.path)
                self.offset.append(m.offset)
                self.size.append(m.size)
                self.data.append(m.data)
                self.inline += 0 if m.data is None else m.size
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


class _Keys:
    """The keys of the metadata rows being matched with samples (sample numbers
    ``start`` on): what names a damaged sample in its message."""

    def __init__(self) -> None:
        self.start = 0
        self.keys: list[str] = []

    def __call__(self, number: int) -> str:
        at = number - self.start
        return str(self.keys[at]) if 0 <= at < len(self.keys) else ""


class ExportSource(StoredSource):
    """Samples of a committed export, every split, with their metadata."""

    kind: ClassVar[str] = "shardex-export"
    # inline bytes (an array backend's samples) are made batch by batch from its files
    bytes_in_memory: ClassVar[bool] = False

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        if spec.is_url:
            return cls(spec.location.rstrip("/"), spec.storage_options)  # type: ignore[union-attr]
        return cls(spec.location)

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """The samples in batches (see :meth:`Source.stream`); with a Ray ``runner``, a
        ``webdataset`` export's samples on object storage are read and checked by its
        tasks (see :mod:`shardex.backends.webdataset.stored`)."""
        from shardex.contract import ExportConfig

        storage = open_storage(self.uri, self.storage_options)
        config = ExportConfig.read(storage)
        return SampleStream(self._batches(storage, config, runner), config.label_names)

    def _batches(
        self, storage: Storage, config: ExportConfig, runner: MapRunner | None
    ) -> Iterator[ScanBatch]:
        with _checked_metadata(storage, config) as path:
            for split in config.splits:
                yield from self._split(storage, config, split, path, runner)

    def _split(
        self,
        storage: Storage,
        config: ExportConfig,
        split: str,
        meta_file: Path,
        runner: MapRunner | None,
    ) -> Iterator[ScanBatch]:
        """A split's samples in batches, checked against its metadata rows as they come."""
        from shardex.api import open_dataset

        ds = open_dataset(storage, split=split, on_error="skip")
        backend = backend_for(config)
        keys = _Keys()
        stored = backend.stored_samples(ds, keys, runner)
        samples = (
            stored
            if stored is not None
            else _dataset_samples(ds, backend.damaged_samples(storage, config, split), keys)
        )
        where = storage.join(_metadata_name(config))
        start = 0
        for rows in _row_batches(meta_file, split, where, self.batch_size):
            keys.start, keys.keys = start, rows.column("key").to_pylist()
            done = 0
            while done < rows.num_rows:
                chunk = _take(samples, rows.num_rows - done)
                if not chunk.keys:  # fewer samples than the metadata lists
                    raise self._different(config, split)
                batch = rows.slice(done, len(chunk.keys))
                yield ScanBatch(self._batch(config, split, chunk, batch))
                done += len(chunk.keys)
            start += rows.num_rows
        if next(samples, None) is not None:  # more samples than the metadata lists
            raise self._different(config, split)

    def _batch(self, config: ExportConfig, split: str, chunk: _Samples, rows: pa.Table) -> pa.Table:
        expected = rows.column("key").to_pylist()
        good = [k for k, bad in zip(chunk.keys, chunk.invalid, strict=True) if bad is None]
        if len(expected) != len(chunk.keys) or good != [
            k for k, bad in zip(expected, chunk.invalid, strict=True) if bad is None
        ]:
            raise self._different(config, split)
        # keys of damaged samples come from the metadata: their bytes cannot be trusted
        chunk.keys = expected
        member = config.shard_options.get("image_member")
        if member is not None and IMAGE_FORMAT in rows.column_names:
            chunk.restore_images(member, rows.column(IMAGE_FORMAT).to_pylist())
            # shardex's own column, not the user's: an image_member re-export adds it again
            rows = rows.drop_columns([IMAGE_FORMAT])
        return _table(chunk, rows)

    def _different(self, config: ExportConfig, split: str) -> SourceError:
        return SourceError(
            f"{self.uri}: split {split!r}: the shards and {_metadata_name(config)} list "
            "different samples (the export is damaged; run shardex verify)"
        )


def _take(samples: Iterator[StoredSample], most: int) -> _Samples:
    """Up to ``most`` samples, fewer where their inline bytes reach :data:`INLINE_BYTES`
    (none only when the samples have run out)."""
    chunk = _Samples()
    while len(chunk.keys) < most and chunk.inline < INLINE_BYTES:
        sample = next(samples, None)
        if sample is None:
            break
        chunk.add(sample)
    return chunk


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


@contextlib.contextmanager
def _checked_metadata(storage: Storage, config: ExportConfig) -> Iterator[Path]:
    """The local path of the export's metadata.parquet, checked against its checksum (a
    copy on local scratch when it is not a local file), or a one-line error naming it."""
    name = _metadata_name(config)
    where = storage.join(name)
    with _source_errors(where), contextlib.ExitStack() as stack:
        path = storage.local_path(name)
        if path is None:
            from shardex.storage.scratch import scratch

            path = stack.enter_context(scratch("source")) / "metadata.parquet"
            with open(path, "wb") as f:
                for chunk in storage.iter_chunks(name):
                    f.write(chunk)
        check_local_file(Path(path), config.metadata_checksum, where)
        yield Path(path)


@contextlib.contextmanager
def _source_errors(where: str) -> Iterator[None]:
    """What reading the source's metadata.parquet raises, as one-line SourceErrors."""
    try:
        yield
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


def _row_batches(path: Path, split: str, where: str, size: int) -> Iterator[pa.Table]:
    """The split's metadata rows in sample order, at most ``size`` at a time."""
    pending: list[pa.Table] = []
    held = 0
    for table in _split_rows(path, split, where):
        pending.append(table)
        held += table.num_rows
        while held >= size:
            joined = pa.concat_tables(pending)
            yield joined.slice(0, size)
            rest = joined.slice(size)
            pending, held = [rest], rest.num_rows
    if held:
        yield pa.concat_tables(pending)


def _split_rows(path: Path, split: str, where: str) -> Iterator[pa.Table]:
    """The split's metadata rows in sample order, row group by row group where the row
    groups' statistics show that they follow each other in sample order (an export
    writes one per shard), else all at once (an older export's file)."""
    with _source_errors(where), metadata_errors(where):
        file = pq.ParquetFile(path)
        names = file.schema_arrow.names
        missing = [c for c in ("key", "original_path", "split") if c not in names]
        if missing:
            raise SourceError(f"{where} of the source export lacks the column(s) {missing}")
        groups = _ordered_groups(file, split)
    if groups is None:
        with _source_errors(where), metadata_errors(where):
            table = pq.read_table(path, filters=[("split", "=", split)])
        yield table.sort_by("sample_index") if "sample_index" in table.column_names else table
        return
    for group in groups:
        with _source_errors(where), metadata_errors(where):
            table = file.read_row_group(group)
            table = table.filter(pc.equal(table.column("split"), split))
        yield table.sort_by("sample_index")


def _ordered_groups(file: pq.ParquetFile, split: str) -> list[int] | None:
    """The row groups holding rows of ``split``, in sample order, or None when their
    statistics do not say (or their sample numbers interleave)."""
    meta = file.metadata
    names = file.schema_arrow.names
    if "sample_index" not in names:
        return None
    at_split, at_index = names.index("split"), names.index("sample_index")
    found: list[tuple[int, int, int]] = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        splits, numbers = group.column(at_split).statistics, group.column(at_index).statistics
        if splits is None or numbers is None or not (splits.has_min_max and numbers.has_min_max):
            return None
        if not splits.min <= split <= splits.max:
            continue
        if splits.min != splits.max:
            return None  # another split's numbers in the group: its range says nothing
        found.append((numbers.min, numbers.max, g))
    found.sort()
    if any(a[1] >= b[0] for a, b in itertools.pairwise(found)):
        return None
    return [g for _, _, g in found]


def _dataset_samples(
    ds: Dataset, damaged: dict[int, str], key: Callable[[int], str]
) -> Iterator[StoredSample]:
    """The samples read through the dataset (which checks what it reads) one at a time;
    samples it skips as damaged come back invalid, with its message, as do the
    ``damaged`` ones (sample number -> reason)."""
    skipped: list[tuple[int, str]] = ds.skipped  # type: ignore[attr-defined]
    reasons: dict[int, str] = {}
    seen = 0

    def absorb() -> None:  # what the dataset skipped before the sample it just gave
        nonlocal seen
        for n, message in skipped[seen:]:
            reasons[n] = f"source sample {n}: {message}"
        seen = len(skipped)

    got = iter(ds)
    pending = next(got, None)
    absorb()
    number = 0
    while True:
        reason = reasons.pop(number, None)
        if reason is not None:
            yield StoredSample(key(number), (), reason)
        elif pending is None:
            return
        else:
            members = tuple(
                StoredMember(name, None, -1, len(v), v)
                for name, v in pending.items()
                if name != "__key__"
            )
            yield StoredSample(str(pending["__key__"]), members, damaged.get(number))
            pending = next(got, None)
            absorb()
        number += 1
