"""An existing shardex export as a source: splits, labels, keys and metadata are kept.
Every sample is checked against the source's checksums as it is read (a damaged one is
marked ``_invalid``), so damage never passes into a new export that would then verify.
Memory stays bounded: metadata.parquet is read row group by row group.
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

_FROM_METADATA: Final = ("cls", "json")  # fields restored from metadata.parquet
INLINE_BYTES: Final = 16 << 20


@dataclass
class _Samples:
    """Some samples of a split, column by column, and why each damaged one cannot be used."""

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
        """Give images stored as ``KEY.<member>`` their ``image_format``'s extension back."""
        for i, image_format in enumerate(formats):
            for m in range(self.offsets[i], self.offsets[i + 1]):
                if self.ext[m] == member:
                    self.ext[m] = original_extension(image_format, member)

    def members(self) -> pa.Array:
        data = self.data if any(d is not None for d in self.data) else None
        return members_array(self.offsets, self.ext, self.path, self.offset, self.size, data)


class _Keys:
    """The keys of the metadata rows being matched (sample ``start`` on), naming damaged samples."""

    def __init__(self) -> None:
        self.start = 0
        self.keys: list[str] = []

    def __call__(self, number: int) -> str:
        at = number - self.start
        return str(self.keys[at]) if 0 <= at < len(self.keys) else ""


class ExportSource(StoredSource):
    """Samples of a committed export, every split, with their metadata."""

    kind: ClassVar[str] = "shardex-export"
    bytes_in_memory: ClassVar[bool] = False

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        if spec.is_url:
            return cls(spec.location.rstrip("/"), spec.storage_options)  # type: ignore[union-attr]
        return cls(spec.location)

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """The samples in batches; a Ray ``runner``'s tasks read a remote webdataset export."""
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
    """Up to ``most`` samples, fewer once their inline bytes reach :data:`INLINE_BYTES`."""
    chunk = _Samples()
    while len(chunk.keys) < most and chunk.inline < INLINE_BYTES:
        sample = next(samples, None)
        if sample is None:
            break
        chunk.add(sample)
    return chunk


def _table(samples: _Samples, meta: pa.Table) -> pa.Table:
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
    """The local path of the checksum-checked metadata.parquet (a scratch copy if remote)."""
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
    """The split's metadata rows in sample order: by row group where statistics allow."""
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
    """The row groups of ``split`` in sample order, or None when their statistics do not say."""
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
    """The samples read through the dataset; those it skips, and the ``damaged`` ones, invalid."""
    skipped: list[tuple[int, str]] = ds.skipped  # type: ignore[attr-defined]
    reasons: dict[int, str] = {}
    got = iter(ds)
    pending = next(got, None)
    seen = number = 0
    while True:
        for n, message in skipped[seen:]:  # skipped before the sample it just gave
            reasons[n] = f"source sample {n}: {message}"
        seen = len(skipped)
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
        number += 1
