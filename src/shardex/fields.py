"""Sample fields, named as WebDataset names tar members (``jpg``, ``NAME.npy``, ``cls``,
``json``): every backend stores and returns them, so exports convert without loss. This
module decides each field's stored form (:class:`FieldSpec`) once, before any write.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.contract import FieldSpec
from shardex.errors import ConfigError
from shardex.names import relpath_problem
from shardex.refs.members import JSON_COLUMN, LABEL_FIELD, Members
from shardex.refs.scan import MEMBER_TYPE, MEMBERS
from shardex.sources.arrays import npy_bytes as npy_bytes
from shardex.storage.fetch.bytes import ByteSource


def is_fixed(spec: FieldSpec) -> bool:
    """Whether a field can be one (N, ...) array: not bytes, one shape in every sample."""
    return spec.kind != "bytes" and None not in spec.shape


def field_key(name: str) -> str:
    """``x.npy`` -> ``x``; ``caption.txt`` -> ``caption``; ``cls`` -> ``label``; image
    extensions -> ``image``."""
    if name == LABEL_FIELD:
        return "label"
    stem, dot, last = name.rpartition(".")
    if last.lower() in IMAGE_EXTENSIONS:
        return "image"
    return stem if dot and last in ("npy", "txt") else name


def is_array_field(name: str) -> bool:
    return name == "npy" or name.endswith(".npy")


def with_columns(
    specs: tuple[FieldSpec, ...], y_keys: tuple[str, ...], label_prefix: str
) -> tuple[FieldSpec, ...]:
    """The specs with their array-backend names: no dots, y keys with the label prefix."""
    out = []
    for spec in specs:
        key = field_key(spec.name)
        base = spec.name.replace(".", "_") if spec.kind == "bytes" else key.replace(".", "_")
        column = f"{label_prefix}{base}" if key in y_keys else base
        out.append(dataclasses.replace(spec, column=column))
    columns = [s.column for s in out]
    # a column names a file of array backends
    bad = [c for c in columns if "/" in c or relpath_problem(c) is not None]
    if bad:
        raise ConfigError(
            f"field names {bad} cannot name files or arrays ('/', '\\', a control character "
            "or empty); rename them in the source"
        )
    if len(set(columns)) != len(columns) or "__key__" in columns:
        raise ConfigError(f"fields {[s.name for s in specs]} map to clashing names {columns}")
    return tuple(out)


def load_npy(data: bytes | memoryview, where: str) -> npt.NDArray[Any]:
    """Parse ``.npy`` bytes; a bad or object array names the sample."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ConfigError(f"{where}: not a readable .npy array ({exc})") from exc
    if not isinstance(array, np.ndarray) or array.dtype.hasobject:
        raise ConfigError(f"{where}: .npy arrays of Python objects cannot be stored")
    return array


class _Merge:
    """Accumulates one field's dtype and shape over samples."""

    def __init__(self, name: str, kind: Literal["bytes", "array", "label"], dtype: str) -> None:
        self.name, self.kind, self.dtype = name, kind, dtype
        self.shape: tuple[int | None, ...] | None = None
        self.count = 0

    def add(self, dtype: str, shape: tuple[int | None, ...], key: str) -> None:
        if dtype != self.dtype:
            raise ConfigError(
                f"field {self.name!r} has dtype {self.dtype} in earlier samples but {dtype} in "
                f"sample {key!r}; store one dtype per key (or cast the source)"
            )
        if self.shape is None:
            self.shape = shape
        elif len(shape) != len(self.shape):
            raise ConfigError(
                f"field {self.name!r} has {len(self.shape)} dimensions in earlier samples but "
                f"{len(shape)} in sample {key!r}; a key's arrays need one number of dimensions"
            )
        else:
            self.shape = tuple(
                a if a == b else None for a, b in zip(self.shape, shape, strict=True)
            )
        self.count += 1

    def spec(self, total: int) -> FieldSpec:
        return FieldSpec(self.name, self.kind, self.dtype, self.shape or (), self.count < total)


class FieldMerger:
    """The specs of every field of an export, accumulated batch by batch; only ``.npy``
    members are read (other members are counted)."""

    def __init__(self) -> None:
        self._merged: dict[str, _Merge] = {}
        self._rows = self._labels_missing = self._json_missing = 0
        self._json = False

    def add(self, rows: pa.Table, members: Members | None = None) -> None:
        members = members if members is not None else Members.of(rows.column(MEMBERS))
        owner = np.repeat(np.arange(members.num_samples), np.diff(members.starts))
        merged = self._merged
        codes, firsts = np.unique(members.ext_codes, return_index=True)
        keys: list[str] | None = None
        source = ByteSource(members)
        try:
            for code in codes[np.argsort(firsts)].tolist():  # first-seen order
                name = members.ext_names[code]
                where = np.flatnonzero(members.ext_codes == code)
                if not is_array_field(name):  # encoded bytes: their length is never a shape
                    merge = merged.setdefault(name, _Merge(name, "bytes", "uint8"))
                    merge.shape, merge.count = (None,), merge.count + len(where)
                    continue
                keys = keys if keys is not None else rows.column("key").to_pylist()
                for j in where.tolist():
                    key = keys[int(owner[j])]
                    array = load_npy(bytes(source.read(j)), f"sample {key!r} field {name!r}")
                    _check_dtype(array, key, name)
                    merge = merged.setdefault(name, _Merge(name, "array", array.dtype.name))
                    merge.add(array.dtype.name, array.shape, key)
        finally:
            source.close()
        self._rows += rows.num_rows
        if "label" in rows.column_names:
            self._labels_missing += rows.column("label").null_count
        if JSON_COLUMN in rows.column_names:
            self._json = True
            self._json_missing += rows.column(JSON_COLUMN).null_count

    def specs(self, with_label: bool, order: Iterable[str] = ()) -> tuple[FieldSpec, ...]:
        """The specs, members in ``order`` (others as seen), then the label and ``.json``."""
        rank = {name: i for i, name in enumerate(order)}
        names = sorted(self._merged, key=lambda n: rank.get(n, len(rank)))
        specs = [self._merged[n].spec(self._rows) for n in names]
        if with_label:
            specs.append(FieldSpec(LABEL_FIELD, "label", "int64", (), self._labels_missing > 0))
        if self._json:
            specs.append(FieldSpec("json", "bytes", "uint8", (None,), self._json_missing > 0))
        return tuple(specs)


def _check_dtype(array: npt.NDArray[Any], key: str, name: str) -> None:
    """Array fields hold numbers or booleans (what every array backend can store)."""
    if array.dtype.kind not in "biufc" or array.dtype.fields is not None:
        raise ConfigError(
            f"sample {key!r} field {name!r} has dtype {array.dtype.str}: array fields must hold "
            "booleans or numbers (store text as NAME.txt, bytes under their own name)"
        )


def column_members(column: pa.ChunkedArray, name: str) -> pa.StructArray:
    """A metadata column as one inline member per row (``NAME.npy`` or ``NAME.txt``; null
    bytes where the row has no value), so that it is stored as a sample field."""
    t = column.type
    datas: list[bytes | None] | pa.Array
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        ext = f"{name}.txt"
        datas = pc.cast(column, pa.binary()).combine_chunks()  # the UTF-8 bytes themselves
    else:
        dtype, shape = _numpy_type(t, name)
        ext = f"{name}.npy"
        datas = []
        for value in column.to_pylist():
            if value is None:
                datas.append(None)
            else:
                datas.append(npy_bytes(np.asarray(value, dtype=dtype).reshape(shape)))
    kind = MEMBER_TYPE.field("data").type
    data = datas.cast(kind) if isinstance(datas, pa.Array) else pa.array(datas, kind)
    n = len(data)
    return pa.StructArray.from_arrays(
        [
            pa.array([ext] * n, MEMBER_TYPE.field("ext").type),
            pa.nulls(n, MEMBER_TYPE.field("path").type),
            pa.array(np.full(n, -1, np.int64), MEMBER_TYPE.field("offset").type),
            pc.fill_null(pc.binary_length(data), 0).cast(MEMBER_TYPE.field("size").type),
            data,
        ],
        fields=list(MEMBER_TYPE),
    )


def _numpy_type(t: pa.DataType, name: str) -> tuple[np.dtype[Any], tuple[int, ...]]:
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise ConfigError(
            f"metadata column {name!r} ({t}) cannot be a stored key; "
            "numbers, fixed-size lists of numbers and strings can"
        )
    return np.dtype(t.to_pandas_dtype()), tuple(shape)


def add_members(rows: pa.Table, extra: Iterable[pa.StructArray]) -> pa.Table:
    """Append :func:`column_members` (where not null) to every row's members."""
    column = rows.column(MEMBERS)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    values = pc.list_flatten(column)
    pieces = [values]
    # each member's row, its place in the row, and its number in the joined members
    owner = [pc.list_parent_indices(column).to_numpy(zero_copy_only=False).astype(np.int64)]
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(
        pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False), out=starts[1:]
    )
    place = [np.arange(len(values), dtype=np.int64) - starts[owner[0]]]
    number = [np.arange(len(values), dtype=np.int64)]
    base = len(values)
    for k, members in enumerate(extra):
        kept = np.flatnonzero(
            pc.is_valid(pc.struct_field(members, "data")).to_numpy(zero_copy_only=False)
        )
        pieces.append(members)
        owner.append(kept.astype(np.int64))
        place.append(np.full(len(kept), 1 << 40 | k, np.int64))
        number.append(base + kept)
        base += len(members)
    rows_of, places, numbers = (np.concatenate(x) for x in (owner, place, number))
    order = np.lexsort((places, rows_of))
    joined = pa.concat_arrays([p.cast(MEMBER_TYPE) for p in pieces])
    flat = joined.take(pa.array(numbers[order]))
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(rows_of, minlength=n), out=offsets[1:])
    at = rows.column_names.index(MEMBERS)
    kept_type = rows.schema.field(MEMBERS).type
    return rows.set_column(
        at, MEMBERS, pa.ListArray.from_arrays(pa.array(offsets), flat, type=kept_type)
    )


def cast_members(rows: pa.Table, dtype: str) -> pa.Table:
    """``--dtype``: floating-point ``.npy`` members cast to ``dtype``, made inline bytes."""
    target = np.dtype(dtype)
    column = rows.column(MEMBERS)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    members = Members.of(column)
    arrays = [c for c, name in enumerate(members.ext_names) if is_array_field(name)]
    picked = np.flatnonzero(np.isin(members.ext_codes, arrays)).astype(np.int64)
    if not len(picked):
        return rows
    owners = np.searchsorted(members.starts, picked, side="right") - 1
    keys = rows.column("key")
    cast: dict[int, bytes] = {}
    source = ByteSource(members)
    try:
        source.expect(picked.tolist())
        for j, owner in zip(picked.tolist(), owners.tolist(), strict=True):
            where = f"sample {keys[owner].as_py()!r} field {members.ext(j)!r}"
            array = load_npy(bytes(source.read(j)), where)
            if array.dtype.kind == "f" and array.dtype != target:
                cast[j] = npy_bytes(array.astype(target))
    finally:
        source.close()
    if not cast:
        return rows
    at = rows.column_names.index(MEMBERS)
    return rows.set_column(at, MEMBERS, _replaced(column, cast))


def _replaced(column: pa.ListArray, data: dict[int, bytes]) -> pa.ListArray:
    flat = pc.list_flatten(column)
    fields = {f.name: pc.struct_field(flat, f.name) for f in MEMBER_TYPE}
    mask = np.zeros(len(flat), bool)
    at = sorted(data)
    mask[at] = True
    picks = pa.array(mask)
    new = [data[j] for j in at]
    replaced = {
        "path": pa.nulls(len(at), fields["path"].type),
        "offset": pa.array([-1] * len(at), fields["offset"].type),
        "size": pa.array([len(d) for d in new], fields["size"].type),
        "data": pa.array(new, fields["data"].type),
    }
    for name, values in replaced.items():
        fields[name] = pc.replace_with_mask(fields[name], picks, values)
    struct = pa.StructArray.from_arrays(list(fields.values()), fields=list(MEMBER_TYPE))
    offsets = np.asarray(pc.list_value_length(column).fill_null(0), np.int64).cumsum()
    starts = pa.array(np.concatenate([[0], offsets]).astype(np.int32))
    return pa.ListArray.from_arrays(starts, struct, type=column.type)
