"""What the array backends share: writing runs of columns, and the dataset that reads them.

Two shapes of backend build on :class:`ArrayBackend`:

* **sharded** (``torch``, ``tensor_shards``, ``numpy``): each shard's rows become one run of
  columns, written by a worker as one or more files (:meth:`ArrayBackend.write_run`);
* **per split** (``numpy_mmap``, ``tensordict_memmap``, ``zarr``): the runs of a split are
  joined into one, written once as ``(N, ...)`` arrays.

Every file name carries the split's content hash, so replacing an export never writes over
a file the committed config.yaml still names: the old files stay readable until the new
config.yaml commits, then they are removed. Keys are looked up through a sorted key-hash
table (``S/{stem_name}-{hash}-keys.npy``, the same table as the ``webdataset`` backend's).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, cached_property
from typing import ClassVar

import numpy as np
import pyarrow as pa
import xxhash

from shardex.backends.base import Backend, Check, OnShard, SplitPlan
from shardex.backends.columns import (
    ColumnReader,
    Columns,
    Layout,
    build_columns,
    concat_columns,
    slice_columns,
)
from shardex.backends.metadata import read_metadata
from shardex.contract import ExportConfig, ShardInfo, SplitInfo
from shardex.dataset import OnReadError, ReopenedDataset, Sample
from shardex.errors import (
    ChecksumError,
    ConfigError,
    FormatError,
    SampleNotFoundError,
    ShardexError,
)
from shardex.fields import npy_bytes
from shardex.format.index import build_keys, key_hash
from shardex.format.tables import shard_checksum
from shardex.parallel import Runner
from shardex.rows import JSON_COLUMN, json_text_column
from shardex.sources.base import MEMBERS
from shardex.sources.remote import registered
from shardex.storage.base import Storage

#: Samples read together when iterating (one read per array per block).
_BLOCK = 256
#: Runs a dataset keeps open (or loaded, for one-file shards) for random access.
_CACHED_RUNS = 4


@dataclass(frozen=True, slots=True)
class Written:
    """What writing one run produced: the run's path (a file, or the folder its files are
    under), its other files (those config.yaml lists), their size and a checksum."""

    path: str
    files: tuple[str, ...]
    num_bytes: int
    checksum: str


@dataclass(frozen=True, slots=True)
class _RunJob:
    backend: ArrayBackend
    storage: Storage
    stem: str
    rows: pa.Table
    layout: Layout
    with_label: bool
    write: bool  # False: return the columns (a per-split backend joins them first)
    #: Stores of members on object storage (registered where the job is made).
    stores: tuple[tuple[str, Storage], ...] = dataclasses.field(default_factory=registered)


def _run(job: _RunJob) -> tuple[Written | None, dict[str, np.ndarray] | None, pa.Table]:
    columns = build_columns(job.rows, job.layout, job.with_label, job.stores)
    meta = metadata_rows(job.rows)
    if not job.write:
        return None, columns, meta
    return job.backend.write_run(job.storage, job.stem, columns, job.layout), None, meta


def metadata_rows(rows: pa.Table) -> pa.Table:
    """metadata.parquet rows of samples: NeMo's columns and every metadata column."""
    front = {
        "key": rows.column("key"),
        "image_id": rows.column("key"),
        "original_path": rows.column("original_path"),
        "metadata": json_text_column(rows),
    }
    internal = {MEMBERS, JSON_COLUMN, *front}
    return pa.table(
        {**front, **{c: rows.column(c) for c in rows.column_names if c not in internal}}
    )


class ArrayWriter:
    """Streams named arrays into ``.npy`` files, checksumming what it writes."""

    def __init__(self, storage: Storage, path: str, *, listed: bool) -> None:
        self.storage, self.path, self.listed = storage, path, listed
        self.files: list[str] = []
        self.paths: list[str] = []  # everything written, listed or not
        self.num_bytes = 0
        self._hash = xxhash.xxh3_64()

    def put(self, path: str, data: bytes) -> None:
        self.storage.put(path, data)
        self.paths.append(path)
        if self.listed:
            self.files.append(path)
        self.num_bytes += len(data)
        self._hash.update(data)

    def put_npy(self, path: str, array: np.ndarray) -> None:
        self.put(path, npy_bytes(array))

    def written(self) -> Written:
        return Written(self.path, tuple(self.files), self.num_bytes, shard_checksum(self._hash))


class ArrayBackend(Backend):
    """An array backend writes runs of columns; subclasses say how (and how to read them)."""

    #: One run per split (``(N, ...)`` arrays) instead of one per shard.
    per_split: ClassVar[bool] = False
    #: The run's path prefix: ``S/{stem_name}-{hash}`` (+ ``-NNNNNN`` for shards).
    stem_name: ClassVar[str]
    #: The dataset class that reads it.
    dataset: ClassVar[type[ArrayDataset]]

    @classmethod
    def owns(cls, path: str) -> bool:
        """Its files, declared by :attr:`stem_name`: every path under a split starts with
        the run's stem (``S/{stem_name}-{hash}``, then ``-NNNNNN``, ``-keys.npy``, ``.npz``,
        ``/...``), or matches :attr:`files`."""
        return super().owns(path) or _runs_of(cls.stem_name).fullmatch(path) is not None

    def damaged_samples(self, storage: Storage, config: ExportConfig, split: str) -> dict[int, str]:
        """The samples of runs whose files do not match their checksum in config.yaml, when
        the dataset does not check what it reads (``capabilities.checked_reads``)."""
        if self.capabilities.checked_reads:
            return {}
        from shardex.verification import VerifyReport
        from shardex.verify_arrays import _verify_run

        info = config.split(split)
        out: dict[int, str] = {}
        first = 0
        for shard in info.shards:
            report = VerifyReport(storage.uri)
            if not _verify_run(storage, config, info, shard, report):
                problem = report.problems[0]
                reason = (
                    f"source run {storage.join(shard.path)!r} is damaged "
                    f"({problem.kind}: {problem.message})"
                )
                out.update(dict.fromkeys(range(first, first + shard.num_samples), reason))
            first += shard.num_samples
        return out

    def verify_split(
        self, storage: Storage, config: ExportConfig, split: str, check: Check
    ) -> None:
        from shardex.verify_arrays import verify_array_split

        verify_array_split(storage, config, split, check.report, check.deep, check.bar)

    @abstractmethod
    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        """Write one run of columns under ``stem``; return the files written."""

    def finish_split(
        self, storage: Storage, base: str, plan: SplitPlan, shards: list[ShardInfo]
    ) -> list[str]:
        """Write files that describe the whole split (a manifest); return their paths."""
        return []

    def write_split(
        self, storage: Storage, plan: SplitPlan, runner: Runner, on_shard: OnShard
    ) -> SplitInfo:
        if plan.previous is not None:
            raise ConfigError(
                f"the {self.name} backend cannot append to an export; export the combined "
                "source again with --overwrite (or append with the webdataset backend)"
            )
        base = _fresh_base(f"{plan.split}/{self.stem_name}", plan.name_hash, plan.existing)
        stems = [f"{base}-{k:06d}" for k in range(len(plan.bounds))]
        jobs = (
            _RunJob(
                self,
                storage,
                stem,
                plan.rows.take(np.arange(a, b)),  # a slice would pickle the whole table
                plan.fields,
                plan.with_label,
                not self.per_split,
            )
            for stem, (a, b) in zip(stems, plan.bounds, strict=True)
        )
        shards: list[ShardInfo] = []
        files: list[str] = []
        parts: list[dict[str, np.ndarray]] = []
        for (a, b), (written, columns, meta) in zip(
            plan.bounds, runner.imap(_run, jobs), strict=True
        ):
            if written is not None:
                shards.append(_shard_info(b - a, written))
                files += written.files
            if columns is not None:
                parts.append(columns)
            on_shard(meta, written.num_bytes if written is not None else 0)
        if self.per_split:
            written = self.write_run(storage, base, concat_columns(parts), plan.fields)
            shards = [_shard_info(plan.rows.num_rows, written)]
            files = list(written.files)
        files += self.finish_split(storage, base, plan, shards)
        keys = f"{base}-keys.npy"  # beside the run, never in it (zarr warns of foreign files)
        buf = io.BytesIO()
        np.save(buf, build_keys(plan.rows.column("key").to_pylist()), allow_pickle=False)
        storage.put(keys, buf.getvalue())
        return SplitInfo(
            num_samples=plan.rows.num_rows,
            num_bytes=sum(s.num_bytes for s in shards),
            shards=tuple(shards),
            files=(*files, keys),
            keys=keys,
        )


@cache
def _runs_of(stem_name: str) -> re.Pattern[str]:
    return re.compile(rf"[^/]+/{re.escape(stem_name)}-[0-9a-f]+(?:-\d{{6}})?(?:[./-].*)?")


def _fresh_base(prefix: str, name_hash: str, existing: frozenset[str]) -> str:
    """``{prefix}-{hash}``, re-hashed until no file of the output uses it. The name hash
    covers keys and sizes, not every byte: a replaced export whose labels or pixels
    changed could get the same names, and array runs are rewritten whole, so writing them
    over the files the committed config.yaml names would expose a mix. Into an empty
    output the first name is taken: the same input still gives the same names."""
    base = f"{prefix}-{name_hash}"
    while any(p == base or p.startswith((f"{base}-", f"{base}/", f"{base}.")) for p in existing):
        name_hash = xxhash.xxh3_64(name_hash.encode()).hexdigest()[:12]
        base = f"{prefix}-{name_hash}"
    return base


def _shard_info(num_samples: int, written: Written) -> ShardInfo:
    return ShardInfo(written.path, num_samples, written.num_bytes, written.checksum)


class ArrayDataset(ReopenedDataset):
    """A split of an array backend; subclasses load one run's columns (:meth:`_load`)."""

    def __init__(
        self,
        storage: Storage,
        config: ExportConfig,
        split: str,
        *,
        decode: bool = False,
        verify: bool = True,
        on_error: OnReadError = "raise",
    ) -> None:
        info = config.split(split)
        self.storage, self.config, self.split = storage, config, split
        self.decode, self.verify, self.on_error = decode, verify, on_error
        #: (sample number, message) of damaged samples that iteration skipped.
        self.skipped: list[tuple[int, str]] = []
        self.layout: Layout = config.fields
        self.shards = info.shards
        self._first = np.concatenate([[0], np.cumsum([s.num_samples for s in info.shards])])
        self._n = info.num_samples
        self._keys_path = info.keys
        self._cached: OrderedDict[int, ColumnReader] = OrderedDict()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self._n

    @abstractmethod
    def _load(self, shard: ShardInfo) -> Columns:
        """The columns of one run (memory-mapped or lazily read where the format allows)."""

    def _open_run(self, shard: ShardInfo) -> ColumnReader:
        return ColumnReader(self.layout, self._load(shard))

    def _reader(self, shard: int) -> ColumnReader:
        if self._pid != os.getpid():  # a forked worker reopens: mappings are per process
            self._pid, self._cached = os.getpid(), OrderedDict()
        reader = self._cached.get(shard)
        if reader is None:
            reader = self._cached[shard] = self._open_run(self.shards[shard])
            if len(self._cached) > _CACHED_RUNS:
                self._cached.popitem(last=False)
        self._cached.move_to_end(shard)
        return reader

    def _checked(self, shard: ShardInfo, data: bytes) -> bytes:
        """The bytes of a one-file run, checked against config.yaml when ``verify``."""
        if self.verify:
            found = shard_checksum(xxhash.xxh3_64(data))
            if found != shard.checksum:
                raise ChecksumError(
                    f"{self.storage.join(shard.path)}: checksum {found} differs from "
                    f"{shard.checksum} in config.yaml; the shard is damaged (shardex verify)"
                )
        return data

    def _locate(self, index: int) -> tuple[int, int]:
        n = self._n
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample {index} is out of range for a split of {n} samples")
        shard = int(np.searchsorted(self._first, index, side="right")) - 1
        return shard, index - int(self._first[shard])

    def __getitem__(self, index: int) -> Sample:
        shard, local = self._locate(index)
        return self._reader(shard).sample(local, self.decode)

    @cached_property
    def _key_table(self) -> np.ndarray:
        if self._keys_path is None:
            raise FormatError(f"split {self.split!r} of {self.storage.uri} has no key table")
        local = self.storage.local_path(self._keys_path)
        if local is not None:
            return np.load(local, mmap_mode="r", allow_pickle=False)  # type: ignore[no-any-return]
        data = self.storage.get(self._keys_path)
        return np.load(io.BytesIO(data), allow_pickle=False)  # type: ignore[no-any-return]

    def get(self, key: str) -> Sample:
        table = self._key_table
        h = np.uint64(key_hash(key))
        pos = int(np.searchsorted(table[0], h, side="left"))
        while pos < table.shape[1] and table[0, pos] == h:
            sample = self[int(table[1, pos])]
            if sample["__key__"] == key:
                return sample
            pos += 1
        raise SampleNotFoundError(
            f"no sample with key {key!r} in split {self.split!r} of {self.storage.uri}"
        )

    def __iter__(self) -> Iterator[Sample]:
        for shard, info in enumerate(self.shards):
            start = int(self._first[shard])
            try:
                reader = self._reader(shard)
            except ShardexError as exc:
                if self.on_error == "raise":
                    raise
                for number in range(start, start + info.num_samples):
                    self.skipped.append((number, str(exc)))
                continue
            for offset in range(0, info.num_samples, _BLOCK):
                count = min(_BLOCK, info.num_samples - offset)
                try:
                    block = self._block(reader, offset, count)
                except ShardexError as exc:  # a damaged array chunk: the block is lost
                    if self.on_error == "raise":
                        raise
                    first = start + offset
                    self.skipped.extend((first + k, str(exc)) for k in range(count))
                    continue
                for local in range(count):
                    try:
                        sample = block.sample(local, self.decode)
                    except ShardexError as exc:
                        if self.on_error == "raise":
                            raise
                        self.skipped.append((start + offset + local, str(exc)))
                        continue
                    yield sample

    def _block(self, reader: ColumnReader, start: int, count: int) -> ColumnReader:
        """Samples ``start .. start + count`` of a run, read with one read per array."""
        return ColumnReader(self.layout, slice_columns(reader.columns, start, count))

    def keys(self) -> Iterator[str]:
        """Sample keys in sample order."""
        for shard in range(len(self.shards)):
            reader = self._reader(shard)
            for local in range(len(reader)):
                yield reader.key(local)

    @cached_property
    def metadata(self) -> pa.Table:
        return read_metadata(self.storage, self.config, self.split)
