"""Writing runs of columns for the array backends: one run per shard (``torch``,
``tensor_shards``, ``numpy``) or runs joined into one per split (``numpy_mmap``,
``tensordict_memmap``, ``zarr``). Names carry a content hash, so a replacing export never
writes over a file the committed config.yaml names."""

from __future__ import annotations

import dataclasses
import re
from abc import abstractmethod
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

from shardex.backends.array_files import Written, load_part, put_npys, remove_run
from shardex.backends.base import Backend, Check, SplitPlan, SplitWriter
from shardex.backends.columns import Columns, Layout, columns_of, concat_columns
from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.contract import ExportConfig, ShardInfo, SplitInfo
from shardex.errors import BadSampleError, ConfigError
from shardex.fields import npy_bytes
from shardex.format.index import build_keys_from_hashes, key_hash
from shardex.planning import plan_bounds
from shardex.refs.members import JSON_COLUMN, LABEL_FIELD, Members, json_text_column
from shardex.refs.scan import MEMBERS
from shardex.sample_check import SampleCheck, image_problem, refusal
from shardex.storage.base import Storage
from shardex.storage.fetch.bytes import ByteSource

if TYPE_CHECKING:
    from shardex.backends.array_dataset import ArrayDataset
    from shardex.backends.base import Ints
    from shardex.parallel import Runner
    from shardex.refs.candidates import Candidates


@dataclass(frozen=True, slots=True)
class RunJob:
    """One run to write from its candidates; ``part``: a per-split backend's run, written
    as ``.npy`` parts for :meth:`ArrayBackend.join_runs`."""

    backend: ArrayBackend
    storage: Storage
    stem: str
    layout: Layout
    with_label: bool
    part: bool
    samples_per_shard: int
    max_shard_bytes: int | None
    check: SampleCheck
    first_sample: int
    candidates: Candidates


@dataclass(frozen=True, slots=True)
class RunDone:
    """What writing one run produced (a :class:`~shardex.backends.base.ShardDone`)."""

    written: Written | None
    meta: pa.Table | None
    key_hashes: npt.NDArray[np.uint64]
    num_samples: int
    consumed: int
    complete: bool
    skipped: tuple[dict[str, str], ...] = ()


@dataclass(slots=True)
class _Taken:
    picked: list[int] = dataclasses.field(default_factory=list)
    fields: list[list[tuple[str, bytes | memoryview]]] = dataclasses.field(default_factory=list)
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)
    consumed: int = 0
    full: bool = False


def _take(job: RunJob, candidates: Candidates) -> _Taken:
    """Take good candidates in order until the run is full, reading each member once."""
    from shardex.format.tar import END_OF_ARCHIVE  # the planner counts it in every shard

    got = _Taken()
    rows, members, member_rows = candidates.rows, candidates.members, candidates.member_rows
    n = rows.num_rows
    labels = rows.column("label").to_pylist() if job.with_label else [None] * n
    has_json = JSON_COLUMN in rows.column_names
    texts: list[bytes | None] = rows.column(JSON_COLUMN).to_pylist() if has_json else [None] * n
    image = [e.rpartition(".")[2].lower() in IMAGE_EXTENSIONS for e in members.ext_names]
    starts, codes, names = members.starts, members.ext_codes, members.ext_names
    sizes = np.asarray(candidates.sizes).tolist()
    cap, limit, check = job.max_shard_bytes, job.samples_per_shard, job.check
    source = ByteSource(members)
    planned = plan_bounds(candidates.sizes, limit, cap)
    if planned and any("://" in name for name in members.path_names):  # objects: fetched ahead
        ahead = np.asarray(member_rows[: planned[0][1]], np.int64)
        source.expect(j for r in ahead.tolist() for j in range(starts[r], starts[r + 1]))
    used = len(END_OF_ARCHIVE)
    try:
        for i in range(n):
            count = len(got.picked)
            if count >= limit or (cap is not None and count and used + sizes[i] > cap):
                got.full = True
                break
            got.consumed = i + 1
            r = int(member_rows[i])
            fields: list[tuple[str, bytes | memoryview]] = []
            reason = None
            for j in range(int(starts[r]), int(starts[r + 1])):
                try:
                    data = source.read(j)
                except BadSampleError as exc:
                    reason = exc.reason or str(exc)
                    break
                if image[codes[j]]:
                    reason = image_problem(data, check)
                    if reason:
                        break
                # a copy: file bytes come in memory the source reuses for the next read
                fields.append((names[codes[j]], bytes(data)))
            if reason:
                original = str(rows.column("original_path")[i].as_py())
                if check.on_error == "error":
                    raise BadSampleError(refusal(original, reason), reason=reason)
                key = str(rows.column("key")[i].as_py())
                got.skipped.append({"key": key, "original_path": original, "reason": reason})
                continue
            if labels[i] is not None:
                fields.append((LABEL_FIELD, str(labels[i]).encode()))
            if texts[i] is not None:
                fields.append(("json", texts[i]))  # type: ignore[arg-type]  # checked above
            got.picked.append(i)
            got.fields.append(fields)
            used += sizes[i]
    finally:
        source.close()
    return got


def _write_run(job: RunJob) -> RunDone:
    """Read, check and write one run; hand back small results."""
    candidates = job.candidates.loaded()
    got = _take(job, candidates)
    complete = got.full or candidates.last
    skipped = tuple(got.skipped)
    if not complete or not got.picked:  # ran out of candidates, or every one was bad
        return RunDone(None, None, np.zeros(0, np.uint64), 0, got.consumed, complete, skipped)
    kept = candidates.rows.take(pa.array(got.picked, pa.int64()))
    count = kept.num_rows
    kept = kept.append_column(
        "sample_index", pa.array(np.arange(job.first_sample, job.first_sample + count))
    )
    keys: list[str] = kept.column("key").to_pylist()
    columns = columns_of(keys, got.fields, job.layout)
    consumed = got.consumed
    del got  # the fields' bytes: the columns hold them now
    if job.part:
        written = put_npys(job.storage, job.stem, columns)
    else:
        written = job.backend.write_run(job.storage, job.stem, columns, job.layout)
    hashes = np.fromiter((key_hash(k) for k in keys), np.uint64, count)
    return RunDone(written, metadata_rows(kept), hashes, count, consumed, True, skipped)


def metadata_rows(rows: pa.Table) -> pa.Table:
    """metadata.parquet rows: NeMo's columns and every metadata column."""
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


class ArrayBackend(Backend):
    """A backend that writes runs of columns; subclasses say how, and how to read them."""

    per_split: ClassVar[bool] = False  # one run per split instead of one per shard
    #: Runs are ``S/{stem_name}-{hash}`` (+ ``-NNNNNN`` for shards).
    stem_name: ClassVar[str]
    dataset: ClassVar[type[ArrayDataset]]
    #: Whether the library :meth:`reader_call` names reads local files only.
    local_reader: ClassVar[bool] = True

    @classmethod
    def plain_reader(
        cls, config: ExportConfig, split: str, location: str, storage: Storage
    ) -> str | None:
        info = config.split(split)
        if not info.shards or (cls.local_reader and "://" in location):
            return None
        return cls.reader_call(config, info, location)

    @classmethod
    def reader_call(cls, config: ExportConfig, info: SplitInfo, location: str) -> str | None:
        """:meth:`plain_reader` of a split that has shards (None: no single call)."""
        return None

    @classmethod
    def owns(cls, path: str) -> bool:
        """Paths under a split that start with a run's stem, or match :attr:`files`."""
        return super().owns(path) or _runs_of(cls.stem_name).fullmatch(path) is not None

    def damaged_samples(self, storage: Storage, config: ExportConfig, split: str) -> dict[int, str]:
        """The samples of runs whose files fail their checksum (unchecked datasets only)."""
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

    def sample_sizes(
        self, rows: pa.Table, members: Members, member_rows: Ints, *, with_label: bool
    ) -> Ints:
        """Key, member bytes, 8 for a label and the ``.json`` text of each sample."""
        import pyarrow.compute as pc  # writing code: opening an export does not load it

        rows_at = np.asarray(member_rows, np.int64)
        running = np.zeros(len(members.size) + 1, np.int64)
        np.cumsum(members.size, out=running[1:])
        sizes = running[members.starts[rows_at + 1]] - running[members.starts[rows_at]]
        sizes += pc.binary_length(rows.column("key")).to_numpy(zero_copy_only=False)
        if with_label:
            sizes += np.where(
                pc.is_valid(rows.column("label")).to_numpy(zero_copy_only=False), 8, 0
            )
        if JSON_COLUMN in rows.column_names:
            text = pc.fill_null(pc.binary_length(rows.column(JSON_COLUMN)), 0)
            sizes += text.to_numpy(zero_copy_only=False)
        return sizes.astype(np.int64)

    @abstractmethod
    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        """Write one run of columns under ``stem``."""

    def finish_split(
        self, storage: Storage, base: str, plan: SplitPlan, shards: list[ShardInfo]
    ) -> list[str]:
        """Write split-wide files (a manifest); return their paths."""
        return []

    def join_runs(
        self, storage: Storage, stem: str, runs: list[Written], layout: Layout, num_samples: int
    ) -> Written:
        """A per-split backend's run joined from its parts (the default holds them all)."""
        parts = [load_part(storage, run) for run in runs]
        return self.write_run(storage, stem, concat_columns(parts), layout)

    def split_writer(self, storage: Storage, plan: SplitPlan, *, remote: bool) -> SplitWriter:
        return ArraySplit(self, storage, plan)


class ArraySplit(SplitWriter):
    """A split of an array backend: its runs, then its key table."""

    write = staticmethod(_write_run)

    def __init__(self, backend: ArrayBackend, storage: Storage, plan: SplitPlan) -> None:
        if plan.previous is not None:
            raise ConfigError(
                f"the {backend.name} backend cannot append to an export; export the combined "
                "source again with --overwrite (or append with the webdataset backend)"
            )
        self.backend, self.storage, self.plan = backend, storage, plan
        self.base = _fresh_base(f"{plan.split}/{backend.stem_name}", plan.name_hash, plan.existing)
        self.shards: list[ShardInfo] = []
        self.files: list[str] = []
        self.runs: list[Written] = []  # a per-split backend's parts, joined by finish
        self.hashes: list[npt.NDArray[np.uint64]] = []

    def job(self, candidates: Candidates, first_sample: int, number: int) -> RunJob:
        plan = self.plan
        return RunJob(
            self.backend,
            self.storage,
            f"{self.base}-{number:06d}",
            plan.fields,
            plan.with_label,
            self.backend.per_split,
            plan.samples_per_shard,
            plan.max_shard_bytes,
            plan.check,
            first_sample,
            candidates,
        )

    def add(self, done: RunDone) -> tuple[pa.Table, int]:
        assert done.written is not None  # a run of samples was written
        assert done.meta is not None
        self.hashes.append(done.key_hashes)
        if self.backend.per_split:
            self.runs.append(done.written)
            return done.meta, 0
        self.shards.append(_shard_info(done.num_samples, done.written))
        self.files += done.written.files
        return done.meta, done.written.num_bytes

    def discard(self, done: RunDone) -> None:
        remove_run(self.storage, done.written)

    def finish(self, runner: Runner) -> SplitInfo:
        storage, base = self.storage, self.base
        num_samples = sum(len(h) for h in self.hashes)
        if not num_samples:  # every sample skipped: the split is not exported
            return SplitInfo(num_samples=0, num_bytes=0, shards=())
        shards, files = self.shards, self.files
        if self.backend.per_split:
            written = self.backend.join_runs(
                storage, base, self.runs, self.plan.fields, num_samples
            )
            shards, files = [_shard_info(num_samples, written)], list(written.files)
            self.close()  # the parts, once joined
        files += self.backend.finish_split(storage, base, self.plan, shards)
        keys = f"{base}-keys.npy"  # beside the run, never in it (zarr warns of foreign files)
        storage.put(keys, npy_bytes(build_keys_from_hashes(np.concatenate(self.hashes))))
        return SplitInfo(
            num_samples=num_samples,
            num_bytes=sum(s.num_bytes for s in shards),
            shards=tuple(shards),
            files=(*files, keys),
            keys=keys,
        )

    def close(self) -> None:
        for run in self.runs:  # the parts go once joined (or when the export fails)
            remove_run(self.storage, run)
        self.runs = []


@cache
def _runs_of(stem_name: str) -> re.Pattern[str]:
    return re.compile(rf"[^/]+/{re.escape(stem_name)}-[0-9a-f]+(?:-\d{{6}})?(?:[./-].*)?")


def shard_numbers(shards: tuple[ShardInfo, ...], suffix: str = "") -> tuple[str, str]:
    """(path stem, ``"000000 to 000003"`` or a list) of shards ``{stem}NNNNNN{suffix}``."""
    stem = shards[0].path[: len(shards[0].path) - len(suffix) - 6]
    numbers = [s.path[len(stem) : len(s.path) - len(suffix)] for s in shards]
    if len(numbers) > 1 and numbers == [f"{int(numbers[0]) + k:06d}" for k in range(len(numbers))]:
        return stem, f"{numbers[0]} to {numbers[-1]}"
    return stem, ", ".join(numbers)


def _fresh_base(prefix: str, name_hash: str, existing: frozenset[str]) -> str:
    """``{prefix}-{hash}``, re-hashed until no file of the output uses it: the hash covers
    keys and sizes only, so a changed export could otherwise overwrite committed files."""
    base = f"{prefix}-{name_hash}"
    while any(p == base or p.startswith((f"{base}-", f"{base}/", f"{base}.")) for p in existing):
        name_hash = xxhash.xxh3_64(name_hash.encode()).hexdigest()[:12]
        base = f"{prefix}-{name_hash}"
    return base


def _shard_info(num_samples: int, written: Written) -> ShardInfo:
    return ShardInfo(written.path, num_samples, written.num_bytes, written.checksum)
