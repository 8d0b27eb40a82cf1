"""Planning an export: splits, shard boundaries, deterministic names, and key specs."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from shardex.codecs.images import encoding_of_extension
from shardex.contract import FieldSpec, KeySpec, Role
from shardex.errors import ConfigError
from shardex.fields import field_key
from shardex.names import split_name_problem
from shardex.options import ExportOptions
from shardex.refs.scan import MEMBERS

if TYPE_CHECKING:
    from shardex.refs.rows import Sizes


class _Places(Protocol):
    """What :func:`key_specs` asks of a backend (not imported: the backends import us)."""

    @property
    def name(self) -> str: ...

    @property
    def key_storage(self) -> str | None: ...

    def field_storage(self, field: FieldSpec) -> str: ...


SPLIT_ORDER: Final = ("train", "val", "validation", "valid", "test", "predict")
_CHUNK: Final = 1 << 16


def assign_splits(table: pa.Table, opts: ExportOptions) -> tuple[pa.Table, str]:
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


def ordered_splits(present: set[str], opts: ExportOptions) -> list[str]:
    for name in present:
        problem = split_name_problem(name)
        if problem is not None:
            raise ConfigError(f"{problem}; fix the source's split values")
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
    sizes: Sizes, samples_per_shard: int, max_shard_bytes: int | None
) -> tuple[tuple[int, int], ...]:
    """Row ranges of shards: full by count, or until the next sample would pass the byte
    cap (a larger sample gets a shard of its own); never padded."""
    n = len(sizes)
    if max_shard_bytes is None:  # the sizes are not read (they may be in a file)
        starts = range(0, n, samples_per_shard)
        return tuple((s, min(s + samples_per_shard, n)) for s in starts)
    from shardex.format.tar import END_OF_ARCHIVE

    out, start, used = [], 0, len(END_OF_ARCHIVE)
    for at in range(0, n, _CHUNK):  # a chunk at a time: no Python int per sample at once
        for i, size in enumerate(np.asarray(sizes[at : at + _CHUNK]).tolist(), at):
            full = i - start >= samples_per_shard or (i > start and used + size > max_shard_bytes)
            if full:
                out.append((start, i))
                start, used = i, len(END_OF_ARCHIVE)
            used += size
    if start < n:
        out.append((start, n))
    return tuple(out)


def name_hash(opts: ExportOptions, split: str, digest: str) -> str:
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


def member_keys_of(exts: Iterable[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for ext in sorted(exts):
        out.setdefault(field_key(ext), set()).add(ext)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "image", kv[0])))


def key_specs(
    schema: pa.Schema,
    members: dict[str, set[str]],
    fields: tuple[FieldSpec, ...],
    x_keys: tuple[str, ...],
    y_keys: tuple[str, ...],
    backend: _Places,
    image_formats: tuple[str, ...] | None = None,
) -> tuple[KeySpec, ...]:
    """What config.yaml says of each key: stored fields and Parquet metadata columns.
    ``image_formats``: the images' real encodings under ``image_member``."""
    where = backend.key_storage or backend.name

    def role(key: str) -> Role:
        return "x" if key in x_keys else "y" if key in y_keys else "meta"

    images = [f for f in fields if f.kind == "bytes" and field_key(f.name) == "image"]
    specs = [_image_spec(images, role("image"), where, image_formats)] if images else []
    # an array field named ``image`` (``image.npy``) is its own key when no encoded image is
    stored = {"json", *(["image"] if images else [])}
    for f in fields:
        if field_key(f.name) in stored:
            continue
        stored.add(field_key(f.name))
        specs.append(_field_spec(f, role, backend.field_storage(f)))
    if "json" in {f.name for f in fields} and "json" in members:
        specs.append(KeySpec("json", role("json"), "bytes", None, None, "json", f"{where}:json"))
    for c in schema:
        if c.name in {MEMBERS, "key", "original_path", "split", "label"} or c.name in stored:
            continue
        dtype, shape = _dtype_of(c.type)
        specs.append(KeySpec(c.name, role(c.name), dtype, shape, None, None, "parquet"))
    return tuple(specs)


def _image_spec(
    images: list[FieldSpec], role: Role, where: str, image_formats: tuple[str, ...] | None
) -> KeySpec:
    exts = sorted(f.name for f in images)
    enc = sorted(image_formats or {encoding_of_extension(e) or e for e in exts})
    return KeySpec(
        "image",
        role,
        "uint8",
        (None, None, None),
        "HWC",
        "|".join(enc),
        f"{where}:" + "|".join(exts),
    )


def _field_spec(f: FieldSpec, role: Callable[[str], Role], place: str) -> KeySpec:
    key = field_key(f.name)
    if f.kind == "label":
        return KeySpec(
            "label", role("label"), "int64", (), None, "ascii-int", f"{place},parquet:label"
        )
    if f.kind == "array":
        layout = "fixed" if None not in f.shape and not f.optional else "ragged"
        return KeySpec(key, role(key), f.dtype, f.shape, layout, "npy", place)
    encoding = "utf-8" if f.name.endswith(".txt") else f.name
    return KeySpec(key, role(key), "bytes", None, None, encoding, place)


def select_keys(
    opts: ExportOptions, available: list[str], stored: list[str], with_label: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The x and y keys: as asked, else every stored member and ``with_keys``, and the label."""
    x = opts.x_keys or (*stored, *(k for k in opts.with_keys if k not in stored))
    y = opts.y_keys if opts.y_keys is not None else (("label",) if with_label else ())
    for key in (*x, *y):
        if key not in available:
            raise ConfigError(
                f"key {key!r} is not in the source (available keys: {', '.join(available)})"
            )
    return tuple(x), tuple(y)


def unselected_members(
    members: dict[str, set[str]], x_keys: tuple[str, ...], y_keys: tuple[str, ...]
) -> frozenset[str]:
    return frozenset(
        e for key, exts in members.items() if key not in (*x_keys, *y_keys) for e in exts
    )


def drop_members(table: pa.Table, dropped: frozenset[str]) -> pa.Table:
    """``table`` without the members named ``dropped`` (no Python object per member)."""
    if not dropped:
        return table
    column = table.column(MEMBERS)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = pc.list_flatten(column)
    keep = pc.invert(pc.is_in(pc.struct_field(values, "ext"), pa.array(sorted(dropped))))
    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
    counts = np.bincount(parents[keep.to_numpy(zero_copy_only=False)], minlength=len(column))
    offsets = np.zeros(len(column) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    kept = pa.ListArray.from_arrays(pa.array(offsets), values.filter(keep), type=column.type)
    i = table.column_names.index(MEMBERS)
    return table.set_column(i, MEMBERS, kept)
