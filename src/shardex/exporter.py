"""Export: scan a source, check samples, split, plan shards, write, commit config.yaml.

The order of work makes a crash harmless: shards, Parquet files and index files are each
written under a temporary name and renamed into place; ``config.yaml`` is written last and
is the commit point, so a reader never takes a half-written folder for an export.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from shardex import __version__
from shardex.backends.base import SplitPlan
from shardex.backends.registry import get_backend
from shardex.codecs.images import (
    HEAD_BYTES,
    IMAGE_EXTENSIONS,
    MAX_PIXELS,
    TAIL_BYTES,
    VALIDATE_CHOICES,
    Validate,
    check_decode,
    check_header,
    encoding_of_extension,
)
from shardex.contract import (
    CONFIG_FILE,
    ERRORS_FILE,
    METADATA_FILE,
    ExportConfig,
    KeySpec,
    SourceInfo,
    SplitInfo,
)
from shardex.errors import (
    BadSampleError,
    ConfigError,
    DuplicateKeyError,
    EmptySourceError,
    OutputExistsError,
)
from shardex.format.shard import JSON_COLUMN, MemberReader, parquet_file, sample_sizes
from shardex.parallel import Runner
from shardex.progress import Progress
from shardex.sources import Source, open_source
from shardex.sources.base import MEMBERS
from shardex.storage import Storage, open_storage
from shardex.storage.local import LocalStorage

OnError = Literal["error", "skip"]
SPLIT_ORDER: Final = ("train", "val", "validation", "valid", "test")
#: Files and folders an export may hold; anything else in the output is refused.
_OURS: Final = re.compile(
    r"^(config\.yaml|metadata\.parquet|errors\.parquet|"
    r"[^/]+/(images-[0-9a-f]+-\d{6}\.(tar|parquet)|index-(samples|keys)\.npy))$"
)
_CHUNK: Final = 2000


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """How to export. Every CLI flag of ``export-dataset`` maps to one field."""

    backend: str = "webdataset"
    splits: tuple[str, ...] | None = None
    x_keys: tuple[str, ...] | None = None
    y_keys: tuple[str, ...] | None = None
    labels: bool = True
    samples_per_shard: int = 1000
    max_shard_bytes: int | None = None
    deterministic_name: bool = True
    split_fractions: dict[str, float] | None = None
    seed: int = 0
    workers: int | None = None
    overwrite: bool = False
    on_error: OnError = "error"
    validate: Validate = "header"
    max_pixels: int = MAX_PIXELS
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.samples_per_shard < 1:
            raise ConfigError(f"samples_per_shard must be >= 1, got {self.samples_per_shard}")
        if self.max_shard_bytes is not None and self.max_shard_bytes < 1:
            raise ConfigError(f"max_shard_bytes must be >= 1, got {self.max_shard_bytes}")
        if self.on_error not in ("error", "skip"):
            raise ConfigError(f"on_error must be 'error' or 'skip', got {self.on_error!r}")
        if self.validate not in VALIDATE_CHOICES:
            raise ConfigError(f"validate must be one of {VALIDATE_CHOICES}, got {self.validate!r}")
        if self.split_fractions is not None:
            total = sum(self.split_fractions.values())
            if (
                not self.split_fractions
                or any(v < 0 for v in self.split_fractions.values())
                or abs(total - 1.0) > 1e-6
            ):
                raise ConfigError(
                    f"split fractions must be >= 0 and sum to 1, got {self.split_fractions}"
                )


def parse_split_fractions(text: str) -> dict[str, float]:
    """``"train=0.8,val=0.1,test=0.1"`` -> ``{"train": 0.8, "val": 0.1, "test": 0.1}``."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        try:
            if not eq or not name.strip():
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ConfigError(
                f"bad split fraction {part!r}: use NAME=FRACTION, e.g. train=0.8,val=0.2"
            ) from None
    return out


# ---------------------------------------------------------------- checking samples


@dataclass(frozen=True, slots=True)
class _CheckJob:
    rows: pa.Table  # _members and the scalar metadata columns of a chunk
    validate: Validate
    max_pixels: int
    json_columns: tuple[str, ...]


def _head_tail(member: dict[str, Any], reader: MemberReader) -> tuple[bytes, bytes, int]:
    size = member["size"]
    if member["data"] is not None:
        data = member["data"]
        return data[:HEAD_BYTES], data[-TAIL_BYTES:], size
    base = max(member["offset"], 0)
    path = member["path"]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BadSampleError(
            f"cannot read {path}: {exc.strerror}", path=path, reason=str(exc.strerror)
        ) from exc
    try:
        head = os.pread(fd, min(HEAD_BYTES, size), base)
        tail = os.pread(fd, min(TAIL_BYTES, size), base + max(0, size - TAIL_BYTES))
    finally:
        os.close(fd)
    del reader
    return head, tail, size


def _check_chunk(job: _CheckJob) -> tuple[list[str | None], list[bytes | None]]:
    """Per sample: why it is bad (or None), and its ``.json`` member text (or None)."""
    reasons: list[str | None] = []
    reader = MemberReader()
    try:
        for members in job.rows.column(MEMBERS).to_pylist():
            reason = None
            for m in members:
                if m["ext"].rpartition(".")[2].lower() not in IMAGE_EXTENSIONS:
                    continue
                try:
                    if job.validate == "decode":
                        reason = check_decode(reader.read(m), max_pixels=job.max_pixels)
                    elif job.validate == "header":
                        reason = check_header(*_head_tail(m, reader))
                    elif m["size"] == 0:
                        reason = "empty file (0 bytes)"
                except BadSampleError as exc:
                    reason = exc.reason or str(exc)
                if reason:
                    break
            reasons.append(reason)
    finally:
        reader.close()
    texts: list[bytes | None] = [None] * job.rows.num_rows
    if job.json_columns:
        dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
        texts = [dumps(row).encode() for row in job.rows.select(job.json_columns).to_pylist()]
    return reasons, texts


def _json_columns(table: pa.Table) -> tuple[str, ...]:
    """Metadata columns that go into the ``.json`` member: scalars only.

    Array columns (embeddings) stay typed in Parquet: 768 floats as JSON text would be
    larger than many images.
    """
    fixed = {MEMBERS, "key", "original_path", "split", "label"}
    return tuple(
        f.name
        for f in table.schema
        if f.name not in fixed
        and not (
            pa.types.is_nested(f.type)
            or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type)
        )
    )


# ---------------------------------------------------------------- planning


def _fixed_lists(table: pa.Table) -> pa.Table:
    """List columns whose rows all have one length become fixed-size lists."""
    for i, f in enumerate(table.schema):
        if (pa.types.is_list(f.type) or pa.types.is_large_list(f.type)) and f.name != MEMBERS:
            col = table.column(i)
            lengths = pc.unique(pc.list_value_length(col)).to_pylist()
            if len(lengths) == 1 and lengths[0] is not None and col.null_count == 0:
                table = table.set_column(
                    i, f.name, col.cast(pa.list_(f.type.value_type, lengths[0]))
                )
    return table


def _assign_splits(table: pa.Table, opts: ExportOptions) -> tuple[pa.Table, str]:
    if "split" in table.column_names:
        if opts.split_fractions:
            raise ConfigError(
                "the source already has splits; --split-fractions would re-split it "
                "(drop the option, or export without the source's split folders)"
            )
        return table, "source"
    if not opts.split_fractions:
        return table.append_column("split", pa.array(["train"] * table.num_rows)), "single"
    names = list(opts.split_fractions)
    bounds = np.cumsum([opts.split_fractions[n] for n in names])
    bounds[-1] = 1.0 + 1e-9
    seed = str(opts.seed).encode() + b"\0"
    u = (
        np.fromiter(
            (xxhash.xxh3_64_intdigest(seed + k.encode()) for k in table.column("key").to_pylist()),
            dtype=np.uint64,
            count=table.num_rows,
        ).astype(np.float64)
        / 2.0**64
    )
    picks = np.searchsorted(bounds, u, side="right")
    return table.append_column("split", pa.array(np.array(names)[picks].tolist())), "fractions"


def _split_names(table: pa.Table, opts: ExportOptions) -> list[str]:
    present = set(pc.unique(table.column("split")).to_pylist())
    order = list(opts.split_fractions or ()) + [s for s in SPLIT_ORDER if s in present]
    order += sorted(present - set(order))
    names = [s for s in dict.fromkeys(order) if s in present]
    if opts.splits:
        missing = [s for s in opts.splits if s not in present]
        if missing:
            raise ConfigError(
                f"split(s) {', '.join(missing)} not in the source (it has: {', '.join(names)})"
            )
        names = [s for s in names if s in opts.splits]
    return names


def plan_bounds(
    sizes: np.ndarray, samples_per_shard: int, max_shard_bytes: int | None
) -> tuple[tuple[int, int], ...]:
    """Row ranges of shards: full by count, or until the next sample would pass the byte cap.

    A sample larger than the cap gets a shard of its own; no shard is ever padded.
    """
    n = len(sizes)
    if max_shard_bytes is None:
        starts = range(0, n, samples_per_shard)
        return tuple((s, min(s + samples_per_shard, n)) for s in starts)
    from shardex.format.tar import END_OF_ARCHIVE

    out, start, used = [], 0, len(END_OF_ARCHIVE)
    for i, size in enumerate(sizes.tolist()):
        full = i - start >= samples_per_shard or (i > start and used + size > max_shard_bytes)
        if full:
            out.append((start, i))
            start, used = i, len(END_OF_ARCHIVE)
        used += size
    if start < n:
        out.append((start, n))
    return tuple(out)


def _content_digest(rows: pa.Table, sizes: np.ndarray) -> str:
    h = xxhash.xxh3_128()
    h.update("\n".join(rows.column("key").to_pylist()).encode())
    h.update(sizes.astype("<i8").tobytes())
    return str(h.hexdigest())


def _name_hash(opts: ExportOptions, split: str, digest: str) -> str:
    if not opts.deterministic_name:
        return secrets.token_hex(6)
    basis = json.dumps(
        {
            "split": split,
            "content": digest,
            "backend": opts.backend,
            "samples_per_shard": opts.samples_per_shard,
            "max_shard_bytes": opts.max_shard_bytes,
        },
        sort_keys=True,
    )
    return hashlib.sha256(basis.encode()).hexdigest()[:12]


# ---------------------------------------------------------------- keys and contract


def _dtype_of(t: pa.DataType) -> tuple[str, tuple[int | None, ...]]:
    if pa.types.is_fixed_size_list(t):
        inner, shape = _dtype_of(t.value_type)
        return inner, (t.list_size, *shape)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner, shape = _dtype_of(t.value_type)
        return inner, (None, *shape)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string", ()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes", ()
    if pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t):
        return t.to_pandas_dtype().__name__ if hasattr(t, "to_pandas_dtype") else str(t), ()
    return str(t), ()


def _member_keys(table: pa.Table) -> dict[str, set[str]]:
    """Logical key -> extensions: image extensions are the key ``image``."""
    exts = pc.unique(pc.struct_field(pc.list_flatten(table.column(MEMBERS)), "ext")).to_pylist()
    out: dict[str, set[str]] = {}
    for ext in sorted(exts):
        key = "image" if ext.rpartition(".")[2].lower() in IMAGE_EXTENSIONS else ext
        out.setdefault(key, set()).add(ext)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "image", kv[0])))


def _key_specs(
    table: pa.Table,
    members: dict[str, set[str]],
    with_label: bool,
    x_keys: tuple[str, ...],
    y_keys: tuple[str, ...],
) -> tuple[KeySpec, ...]:
    def role(key: str) -> Literal["x", "y", "meta"]:
        return "x" if key in x_keys else "y" if key in y_keys else "meta"

    specs = []
    for key, exts in sorted(members.items(), key=lambda kv: (kv[0] != "image", kv[0])):
        if key == "image":
            enc = sorted({encoding_of_extension(e) or e for e in exts})
            specs.append(
                KeySpec(
                    "image",
                    role(key),
                    "uint8",
                    (None, None, None),
                    "HWC",
                    "|".join(enc),
                    "tar:" + "|".join(sorted(exts)),
                )
            )
        else:
            specs.append(KeySpec(key, role(key), "bytes", None, None, key, f"tar:{key}"))
    if with_label:
        specs.append(
            KeySpec("label", role("label"), "int64", (), None, "ascii-int", "tar:cls,parquet:label")
        )
    for f in table.schema:
        if f.name in {MEMBERS, "key", "original_path", "split", "label"}:
            continue
        dtype, shape = _dtype_of(f.type)
        specs.append(KeySpec(f.name, role(f.name), dtype, shape, None, None, "parquet"))
    return tuple(specs)


def _select_keys(
    opts: ExportOptions, available: list[str], stored: list[str], with_label: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The x and y keys: as asked, else every stored member (image first) and the label."""
    x = opts.x_keys or tuple(stored)
    y = opts.y_keys if opts.y_keys is not None else (("label",) if with_label else ())
    for key in (*x, *y):
        if key not in available:
            raise ConfigError(
                f"key {key!r} is not in the source (available keys: {', '.join(available)})"
            )
    return tuple(x), tuple(y)


# ---------------------------------------------------------------- output handling


def _check_output(storage: Storage, overwrite: bool) -> list[str]:
    """Refuse an existing export unless overwriting; return the old files to replace."""
    root = storage.local_path("")
    if root is not None and root.exists() and not root.is_dir():
        raise OutputExistsError(f"output {storage.uri} exists and is not a folder")
    existing = list(storage.list())
    foreign = [p for p in existing if not _OURS.match(p)]
    if foreign:
        raise OutputExistsError(
            f"output {storage.uri} holds files shardex did not write (e.g. {foreign[0]!r}); "
            "export into an empty or new folder"
        )
    if existing and not overwrite:
        what = (
            "holds an export"
            if CONFIG_FILE in existing
            else "holds the files of an unfinished export"
        )
        raise OutputExistsError(f"output {storage.uri} {what}; pass --overwrite to replace it")
    return existing


def _remove_stale(storage: Storage, old_files: list[str], config: ExportConfig) -> None:
    """Delete files of a replaced export that the new one does not have."""
    keep = {CONFIG_FILE, METADATA_FILE}
    keep.update(f for f in (config.errors_file,) if f)
    for info in config.splits.values():
        keep.update(p for s in info.shards for p in (s.path, s.metadata) if p)
        if info.index is not None:
            keep.update((info.index.samples, info.index.keys))
    for path in old_files:
        if path not in keep:
            storage.delete(path)


def _write_errors(storage: Storage, skipped: list[dict[str, str]]) -> str | None:
    """errors.parquet: one row per skipped sample with the reason."""
    if not skipped:
        return None
    table = pa.Table.from_pylist(
        skipped,
        schema=pa.schema(
            [("key", pa.string()), ("original_path", pa.string()), ("reason", pa.string())]
        ),
    )
    with storage.open_writer(ERRORS_FILE) as out:
        pq.write_table(table, parquet_file(out))
    return ERRORS_FILE


def _fingerprint(digests: list[str]) -> str:
    return str(xxhash.xxh3_128("\n".join(digests).encode()).hexdigest())


def _drop_unselected_members(
    table: pa.Table, members: dict[str, set[str]], x_keys: tuple[str, ...], y_keys: tuple[str, ...]
) -> pa.Table:
    """Members whose key is neither an x key nor a y key are not stored."""
    dropped = {e for key, exts in members.items() if key not in (*x_keys, *y_keys) for e in exts}
    if not dropped:
        return table
    kept = [[m for m in ms if m["ext"] not in dropped] for ms in table.column(MEMBERS).to_pylist()]
    i = table.column_names.index(MEMBERS)
    return table.set_column(i, MEMBERS, pa.array(kept, table.schema.field(MEMBERS).type))


class _MetadataSink:
    """Streams shard rows into metadata.parquet as shards complete."""

    def __init__(self, storage: Storage) -> None:
        self._out = storage.open_writer(METADATA_FILE)
        self._writer: pq.ParquetWriter | None = None
        self.num_rows = 0

    def __call__(self, table: pa.Table) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(
                parquet_file(self._out), table.schema, compression="zstd"
            )
        self._writer.write_table(table)
        self.num_rows += table.num_rows

    def commit(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._out.commit()

    def abort(self) -> None:
        self._out.abort()


# ---------------------------------------------------------------- export


def _chunks(table: pa.Table, columns: list[str], size: int = _CHUNK) -> Iterator[pa.Table]:
    narrow = table.select(columns)
    for start in range(0, table.num_rows, size):
        yield narrow.slice(start, size)


def _check(
    table: pa.Table, opts: ExportOptions, runner: Runner, progress: Progress
) -> tuple[pa.Table, list[dict[str, str]]]:
    """Drop (or refuse) bad samples and duplicate keys; add the ``.json`` member text."""
    json_cols = _json_columns(table)
    jobs = (
        _CheckJob(chunk, opts.validate, opts.max_pixels, json_cols)
        for chunk in _chunks(table, [MEMBERS, *json_cols])
    )
    bar = progress.task("checking samples", table.num_rows)
    reasons: list[str | None] = []
    texts: list[bytes | None] = []
    for r, t in runner.imap(_check_chunk, jobs):
        reasons += r
        texts += t
        bar.advance(len(r))
    keys = table.column("key").to_pylist()
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        if not key:
            reasons[i] = reasons[i] or "empty sample key"
        elif key in seen:
            if reasons[i] is None:
                first = table.column("original_path")[seen[key]].as_py()
                reasons[i] = f"duplicate key {key!r} (also used by {first})"
        elif reasons[i] is None:
            seen[key] = i
    bad = [i for i, r in enumerate(reasons) if r is not None]
    originals = table.column("original_path")
    skipped = [
        {"key": keys[i], "original_path": originals[i].as_py(), "reason": str(reasons[i])}
        for i in bad
    ]
    if skipped and opts.on_error == "error":
        first = skipped[0]
        err = DuplicateKeyError if first["reason"].startswith("duplicate key") else BadSampleError
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise err(
            f"{first['original_path']}: {first['reason']}{more}; "
            "fix the source or pass --on-error skip"
        )
    if json_cols:
        table = table.append_column(JSON_COLUMN, pa.array(texts, pa.binary()))
    if bad:
        keep = np.ones(table.num_rows, dtype=bool)
        keep[bad] = False
        table = table.filter(pa.array(keep))
    return table, skipped


def export(
    source: str | os.PathLike[str] | Source,
    output: str | os.PathLike[str] | Storage,
    options: ExportOptions | None = None,
    *,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> ExportConfig:
    """Export a dataset; returns the committed contract.

    Args:
        source: a path, table, tar glob, ``demo``, or a Source (see :func:`open_source`).
        output: the export's folder (or storage).
        options: an ExportOptions; or pass its fields as keyword arguments
            (``samples_per_shard=500``, ``split_fractions={"train": 0.9, "val": 0.1}`` ...;
            NeMo's ``images_per_tar`` is accepted for ``samples_per_shard``).
        progress: show progress bars.
        storage_options: options for remote storage.

    Raises:
        OutputExistsError: the output holds an export and ``overwrite`` is off.
        BadSampleError: a sample is corrupt (and ``on_error`` is ``"error"``).
        SourceError: the source is missing, empty or malformed.
    """
    if "images_per_tar" in kwargs:
        kwargs["samples_per_shard"] = kwargs.pop("images_per_tar")
    if options is not None and kwargs:
        raise ConfigError("pass either options= or keyword options, not both")
    opts = options if options is not None else ExportOptions(**kwargs)
    src = open_source(source)
    backend = get_backend(opts.backend)
    storage = open_storage(output, storage_options)
    old_files = _check_output(storage, opts.overwrite)
    with Progress(progress) as bars, Runner(opts.workers) as runner:
        scanning = bars.task(f"scanning {src.uri}", None)
        scan = src.scan()
        scanning.done()
        table, skipped = _check(_fixed_lists(scan.table), opts, runner, bars)
        if table.num_rows == 0:
            raise EmptySourceError(f"every sample of {src.uri} was skipped; nothing to export")
        with_label = opts.labels and "label" in table.column_names
        if "label" in table.column_names and not with_label:
            table = table.drop_columns(["label"])
        table, split_method = _assign_splits(table, opts)
        table = table.append_column("export_index", pa.array(np.arange(table.num_rows)))
        names = _split_names(table, opts)
        members = _member_keys(table)
        internal = {MEMBERS, JSON_COLUMN, "key", "original_path", "split", "label", "export_index"}
        available = [
            *members,
            *(["label"] if with_label else []),
            *[c for c in table.column_names if c not in internal],
        ]
        x_keys, y_keys = _select_keys(opts, available, list(members), with_label)
        table = _drop_unselected_members(table, members, x_keys, y_keys)
        write_label = with_label and "label" in (*x_keys, *y_keys)
        if CONFIG_FILE in old_files:
            storage.delete(CONFIG_FILE)  # de-commit first: the folder stops being an export
        written, digests = _write_splits(
            storage, backend, table, names, opts, write_label, runner, bars
        )
        label_names = scan.label_names if with_label else None
        num_classes = None
        if with_label:
            top = pc.max(table.column("label")).as_py()
            num_classes = len(label_names) if label_names else (None if top is None else top + 1)
        specs = _key_specs(
            table.select([c for c in table.column_names if c not in ("export_index", JSON_COLUMN)]),
            members,
            with_label,
            x_keys,
            y_keys,
        )
        fingerprint = _fingerprint(digests)
        config = ExportConfig(
            backend=backend.name,
            num_samples=sum(s.num_samples for s in written.values()),
            splits=written,
            key_specs=specs,
            x_keys=x_keys,
            y_keys=y_keys,
            writer={"name": "shardex", "version": __version__},
            shardex_version=__version__,
            label_names=label_names,
            num_classes=num_classes,
            feature_shapes={
                s.key: list(s.shape) for s in specs if s.key in x_keys and s.shape is not None
            },
            source_datasets=(
                SourceInfo(src.uri, src.kind, table.num_rows + len(skipped), fingerprint),
            ),
            source_fingerprint=fingerprint,
            split_seed=opts.seed if split_method == "fractions" else None,
            split_fractions=(
                dict(opts.split_fractions or {}) if split_method == "fractions" else None
            ),
            split_method=split_method,
            shard_options={
                "samples_per_shard": opts.samples_per_shard,
                "max_shard_bytes": opts.max_shard_bytes,
                "naming": "deterministic" if opts.deterministic_name else "random",
                "validate": opts.validate,
                "on_error": opts.on_error,
            },
            errors_file=_write_errors(storage, skipped),
            num_skipped=len(skipped),
            extra=dict(opts.extra),
        )
        _remove_stale(storage, old_files, config)
        storage.put(CONFIG_FILE, config.to_yaml().encode())
        if isinstance(storage, LocalStorage):
            storage.sync_dir()
    return config


def _write_splits(
    storage: Storage,
    backend: Any,
    table: pa.Table,
    names: list[str],
    opts: ExportOptions,
    write_label: bool,
    runner: Runner,
    bars: Progress,
) -> tuple[dict[str, SplitInfo], list[str]]:
    """Write every selected split through the backend, streaming metadata.parquet."""
    selected = [table.filter(pc.equal(table.column("split"), s)) for s in names]
    bar = bars.task("writing shards", sum(t.num_rows for t in selected))
    sink = _MetadataSink(storage)

    def on_shard(shard_table: pa.Table) -> None:
        sink(shard_table)
        bar.advance(shard_table.num_rows)

    written: dict[str, SplitInfo] = {}
    digests: list[str] = []
    try:
        for split, rows in zip(names, selected, strict=True):
            rows = rows.append_column("sample_index", pa.array(np.arange(rows.num_rows)))
            sizes = sample_sizes(rows, with_label=write_label)
            digest = _content_digest(rows, sizes)
            digests.append(digest)
            bounds = plan_bounds(sizes, opts.samples_per_shard, opts.max_shard_bytes)
            plan = SplitPlan(split, rows, bounds, _name_hash(opts, split, digest), write_label)
            written[split] = backend.write_split(storage, plan, runner, on_shard)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    return written, digests
