"""Fields as columns, the layout every array backend stores its own way.

A fixed field is ``NAME`` ``(n, *shape)``; a ragged one is ``NAME.data`` (values back to
back), ``NAME.offsets`` (``n + 1``) and, for arrays, ``NAME.shapes``; an optional field
adds ``NAME.present``; keys are the ragged bytes ``__key__`` (see docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from shardex.bfloat16 import as_tensor, is_bfloat16, storage_dtype, to_bits, widened
from shardex.codecs.fields import decode_fields
from shardex.contract import FieldSpec
from shardex.fields import is_fixed, load_npy, npy_bytes

KEY_COLUMN: Final = "__key__"
Columns = Mapping[str, Any]  # name -> array-like (ndarray, memmap, tensor, zarr array)
Layout = tuple[FieldSpec, ...]  # with their column names set (fields.with_columns)


def array_names(layout: Layout) -> list[str]:
    """Every array name a run of samples is stored as, keys first."""
    out = [f"{KEY_COLUMN}.data", f"{KEY_COLUMN}.offsets"]
    for spec in layout:
        if is_fixed(spec):
            out.append(spec.column)
        else:
            out += [f"{spec.column}.data", f"{spec.column}.offsets"]
            if spec.kind == "array":
                out.append(f"{spec.column}.shapes")
        if spec.optional:
            out.append(f"{spec.column}.present")
    return out


def columns_of(
    keys: list[str], samples: Sequence[Sequence[tuple[str, bytes | memoryview]]], layout: Layout
) -> dict[str, np.ndarray]:
    """The arrays of a run of samples from their keys and ``(name, bytes)`` fields."""
    n = len(keys)
    index = {spec.name: k for k, spec in enumerate(layout)}
    values: list[list[Any]] = [[None] * n for _ in layout]
    for i, fields in enumerate(samples):
        for name, data in fields:
            k = index[name]
            spec = layout[k]
            if spec.kind == "array":  # native byte order: what every backend stores
                array = load_npy(bytes(data), f"sample {keys[i]!r} field {name!r}")
                array = array.astype(array.dtype.newbyteorder("="), copy=False)
                values[k][i] = to_bits(array) if is_bfloat16(spec) else array
            elif spec.kind == "label":
                values[k][i] = int(bytes(data))
            else:
                values[k][i] = np.frombuffer(data, np.uint8)
    out = _ragged([np.frombuffer(k.encode(), np.uint8) for k in keys], KEY_COLUMN, False)
    for spec, column in zip(layout, values, strict=True):
        name = spec.column
        present = np.array([v is not None for v in column], dtype=bool)
        if is_fixed(spec):
            dense = np.zeros((n, *(int(d or 0) for d in spec.shape)), dtype=storage_dtype(spec))
            for row in np.flatnonzero(present).tolist():
                dense[row] = column[row]
            out[name] = dense
        else:
            empty = np.empty((0,) * max(len(spec.shape), 1), dtype=storage_dtype(spec))
            out.update(
                _ragged([empty if v is None else v for v in column], name, spec.kind == "array")
            )
        if spec.optional:
            out[f"{name}.present"] = present
    return out


def _ragged(arrays: list[np.ndarray], name: str, shapes: bool) -> dict[str, np.ndarray]:
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    dtype = arrays[0].dtype if arrays else np.uint8
    flat = np.concatenate([a.ravel() for a in arrays]) if arrays else np.empty(0, dtype)
    out = {f"{name}.data": flat.astype(dtype, copy=False), f"{name}.offsets": offsets}
    if shapes:
        ndim = arrays[0].ndim if arrays else 0
        out[f"{name}.shapes"] = np.array([a.shape for a in arrays], dtype=np.int64).reshape(
            len(arrays), ndim
        )
    return out


def concat_columns(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several runs of columns as one (offsets re-based)."""
    out: dict[str, np.ndarray] = {}
    for name in parts[0]:
        if name.endswith(".offsets"):
            base, pieces = 0, [np.zeros(1, np.int64)]
            for p in parts:
                pieces.append(p[name][1:] + base)
                base += int(p[name][-1])
            out[name] = np.concatenate(pieces)
        else:
            out[name] = np.concatenate([p[name] for p in parts])
    return out


def slice_columns(columns: Columns, start: int, count: int) -> dict[str, np.ndarray]:
    """Rows ``start .. start + count`` of a run, offsets re-based, one read per array."""
    out: dict[str, np.ndarray] = {}
    for name in columns:
        if name.endswith(".data"):
            continue
        if name.endswith(".offsets"):
            base = name[: -len(".offsets")]
            offsets = np.asarray(columns[name][start : start + count + 1], dtype=np.int64)
            out[f"{base}.data"] = np.asarray(columns[f"{base}.data"][offsets[0] : offsets[-1]])
            out[name] = offsets - offsets[0]
        else:
            out[name] = np.asarray(columns[name][start : start + count])
    return out


class ColumnReader:
    """Samples of one run of columns, as raw fields or decoded values."""

    def __init__(self, layout: Layout, columns: Columns) -> None:
        self.layout = layout
        self.columns = columns
        self._kinds: dict[str, str] = {f.name: f.kind for f in layout}

    def __len__(self) -> int:
        return len(self.columns[f"{KEY_COLUMN}.offsets"]) - 1

    def _slice(self, name: str, i: int) -> Any:
        offsets = self.columns[f"{name}.offsets"]
        start, end = int(offsets[i]), int(offsets[i + 1])
        return self.columns[f"{name}.data"][start:end]

    def key(self, i: int) -> str:
        return bytes(np.asarray(self._slice(KEY_COLUMN, i))).decode()

    def native(self, i: int) -> dict[str, Any]:
        """Field name -> stored value (ndarray or bfloat16 tensor, int label, or bytes)."""
        out: dict[str, Any] = {}
        for spec in self.layout:
            name = spec.column
            if spec.optional and not bool(self.columns[f"{name}.present"][i]):
                continue
            if is_fixed(spec):
                value = np.array(self.columns[name][i])  # a copy: never a view of a mapping
            else:
                value = np.asarray(self._slice(name, i))
                if spec.kind == "array":
                    value = value.reshape(tuple(int(d) for d in self.columns[f"{name}.shapes"][i]))
            out[spec.name] = as_tensor(value) if is_bfloat16(spec) else native_value(spec, value)
        return out

    def sample(self, i: int, decode: bool) -> dict[str, Any]:
        """Sample ``i`` the way the ``webdataset`` backend returns it."""
        return {"__key__": self.key(i), **as_sample(self._kinds, self.native(i), decode)}


def native_value(spec: FieldSpec, value: np.ndarray) -> Any:
    """A stored value as a sample holds it: an int label, bytes, or the array."""
    if spec.kind == "label":
        return int(value)
    if spec.kind == "bytes":
        return value.tobytes()
    return value


def as_sample(kinds: dict[str, str], native: dict[str, Any], decode: bool) -> dict[str, Any]:
    """Stored values as the ``webdataset`` backend returns fields: raw (``.npy`` bytes,
    label digits; bfloat16 as float32 ``.npy``) or decoded."""
    if not decode:
        return {
            name: (
                npy_bytes(v if isinstance(v, np.ndarray) else widened(v))
                if kinds[name] == "array"
                else str(v).encode()
                if kinds[name] == "label"
                else v
            )
            for name, v in native.items()
        }
    encoded = {n: v for n, v in native.items() if kinds[n] == "bytes"}
    return {**{n: v for n, v in native.items() if kinds[n] != "bytes"}, **decode_fields(encoded)}
