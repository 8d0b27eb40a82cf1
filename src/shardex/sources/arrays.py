"""In-memory arrays as a source: ``shardex.export({"x": xs, "y": ys}, out)``. Each entry is
a field: arrays (or ragged ones) as ``NAME.npy``, bytes kept as ``NAME``, str as
``NAME.txt``; ``label``, ``split`` and ``key`` are reserved.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.errors import SourceError
from shardex.refs.pinned import Pinned, buffers
from shardex.refs.scan import SampleStream, ScanBatch, batch_table, members_array
from shardex.sources.base import DEFAULT_BATCH_SIZE, MapRunner, Source, check_batch_size
from shardex.sources.probe import SourceSpec

_BATCH_BYTES: Final = 1 << 30  # Arrow's binary offsets are 32-bit


class ArraySource(Source):
    """Samples made of in-memory arrays, byte strings and strings. An export writes byte
    strings from the caller's own objects (no copy): leave them unchanged until it returns."""

    kind: ClassVar[str] = "arrays"

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        return cls(spec.value)  # type: ignore[arg-type]  # (its probe: a Mapping)

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        label_names: Sequence[str] | None = None,
        metadata: pa.Table | None = None,
        uri: str = "arrays",
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.data = dict(data)
        self.label_names = tuple(label_names) if label_names is not None else None
        self.metadata = metadata
        self.uri = uri
        self.batch_size = check_batch_size(batch_size)

    def _length(self) -> int:
        lengths = {name: len(v) for name, v in self.data.items()}
        if not lengths or len(set(lengths.values())) != 1:
            raise SourceError(f"array source: every entry needs the same length, got {lengths}")
        return next(iter(lengths.values()))

    def stream(self) -> SampleStream:
        return self._stream(pin=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_pinned"}  # this process's

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """An export's stream: byte strings pinned, written from the caller's own objects
        in this process (see :mod:`shardex.refs.pinned`)."""
        del runner  # in-memory bytes are written where they are
        return self._stream(pin=True)

    def _stream(self, pin: bool) -> SampleStream:
        n = self._length()
        if self.metadata is not None and self.metadata.num_rows != n:
            raise SourceError(
                f"array source: metadata has {self.metadata.num_rows} rows for {n} samples; "
                "give it one row per sample"
            )
        data = dict(self.data)
        keys = data.pop("key", None)
        labels = data.pop("label", None)
        splits = data.pop("split", None)
        # encoded up front: fails early, in one line
        fields = [_encode(name, values, pin) for name, values in data.items()]
        # the caller's byte strings, pinned while this source lives (its export's length)
        self._pinned = [f.pinned for f in fields if f.pinned is not None]
        return SampleStream(self._batches(n, fields, keys, labels, splits), self.label_names)

    def _batches(
        self, n: int, fields: list[_Field], keys: Any, labels: Any, splits: Any
    ) -> Iterator[ScanBatch]:
        label_column = None if labels is None else _labels(labels)
        sizes = sum((f.sizes for f in fields), np.zeros(n, np.int64))
        for start, stop in _bounds(sizes, self.batch_size):
            count = stop - start
            table = batch_table(
                _keys(keys, start, stop),
                [f"{self.uri}[{i}]" for i in range(start, stop)],
                _members(fields, start, stop),
                splits=None if splits is None else [str(s) for s in splits[start:stop]],
                labels=None if label_column is None else label_column.slice(start, count),
                metadata=None if self.metadata is None else self.metadata.slice(start, count),
            )
            yield ScanBatch(table)


def _bounds(sizes: np.ndarray, batch_size: int) -> Iterator[tuple[int, int]]:
    """Batches of at most ``batch_size`` samples and (past one sample) ``_BATCH_BYTES``."""
    n = len(sizes)
    ends = np.cumsum(sizes)
    start = 0
    if n == 0:
        yield 0, 0
    while start < n:
        stop = min(start + batch_size, n)
        base = ends[start - 1] if start else 0
        fits = int(np.searchsorted(ends[start:stop], base + _BATCH_BYTES, side="right"))
        stop = start + max(1, fits)
        yield start, stop
        start = stop


def _keys(keys: Any, start: int, stop: int) -> list[str]:
    if keys is None:
        return [f"{i:06d}" for i in range(start, stop)]
    return [str(k) for k in keys[start:stop]]


def _labels(labels: Any) -> pa.Array:
    if isinstance(labels, np.ndarray) and labels.dtype.kind in "iub":
        return pa.array(labels.astype(np.int64, copy=False))
    return pa.array([int(v) for v in labels], pa.int64())


def _members(fields: list[_Field], start: int, stop: int) -> pa.Array:
    """Each sample's members (one per field, in field order): pinned byte strings point
    into the caller's list, the others' bytes are made here."""
    count = stop - start
    if not fields:
        return members_array(np.zeros(count + 1, np.int32), [], [], [], [])
    width = len(fields)
    columns = [_columns(f, start, stop) for f in fields]
    order = (
        None if width == 1 else pa.array(np.arange(count * width).reshape(width, count).T.ravel())
    )

    def interleaved(parts: tuple[pa.Array, ...]) -> pa.Array:
        return parts[0] if order is None else pa.concat_arrays(parts).take(order)

    return members_array(
        np.arange(0, count * width + 1, width, dtype=np.int32),
        *map(interleaved, zip(*columns, strict=True)),
    )


def _columns(f: _Field, start: int, stop: int) -> tuple[pa.Array, ...]:
    """A field's member columns (ext, path, offset, size, data) for samples ``start:stop``."""
    count = stop - start
    ext = pa.array([f.ext]).take(np.zeros(count, np.int64))
    if f.pinned is not None:
        path = pa.array([f.pinned.name]).take(np.zeros(count, np.int64))
        at = pa.array(np.arange(start, stop, dtype=np.int64))
        return ext, path, at, pa.array(f.sizes[start:stop]), pa.nulls(count, pa.binary())
    assert f.blobs is not None
    blob = f.blobs(start, stop)
    blob = blob.combine_chunks() if isinstance(blob, pa.ChunkedArray) else blob
    size = pc.binary_length(blob).cast(pa.int64())
    return ext, pa.nulls(count, pa.string()), pa.array(np.full(count, -1)), size, blob


def npy_bytes(array: Any) -> bytes:
    """``.npy`` bytes of an array, C order (what every backend writes back)."""
    buf = io.BytesIO()
    array = np.asarray(array)
    # ascontiguousarray would make a 0-d array 1-d
    np.save(buf, np.ascontiguousarray(array) if array.ndim else array, allow_pickle=False)
    return buf.getvalue()


@dataclass(frozen=True, slots=True)
class _Field:
    """One entry of the mapping, ready to be cut into batches."""

    ext: str
    sizes: np.ndarray
    blobs: Callable[[int, int], pa.Array] | None
    pinned: Pinned | None = None


def _encode(name: str, values: Any, pin: bool) -> _Field:
    if isinstance(values, np.ndarray):
        if values.dtype.hasobject:
            raise SourceError(f"array source: {name!r} holds Python objects; use a numeric dtype")
        if values.ndim > 1 or (values.dtype.kind in "biufcmM" and values.dtype.isnative):
            return _npy_rows(f"{name}.npy", values)
        # rows of a 1-d array are numpy scalars, which come back native and, for bytes
        # and str, as long as their value: each row's .npy keeps what its scalar is
        return _Field(
            f"{name}.npy",
            np.full(len(values), values.dtype.itemsize + 256, np.int64),
            lambda a, b: pa.array([npy_bytes(v) for v in values[a:b]], pa.binary()),
        )
    first = values[0] if len(values) else None
    if isinstance(first, bytes | bytearray | memoryview):
        if not all(type(v) is bytes for v in values):
            values = buffers(values)
        sizes = np.fromiter(map(len, values), np.int64, len(values))
        if pin:
            return _Field(name, sizes, None, Pinned(values))
        return _Field(name, sizes, lambda a, b: pa.array(values[a:b], pa.binary()))
    if isinstance(first, str):
        text = pa.array([v if type(v) is str else str(v) for v in values], pa.string())
        data = text.cast(pa.binary())  # UTF-8 already: no copy
        sizes = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(np.int64)
        return _Field(f"{name}.txt", sizes, lambda a, b: data.slice(a, b - a))
    if isinstance(first, np.ndarray):
        sizes = np.fromiter((np.asarray(v).nbytes + 256 for v in values), np.int64, len(values))
        return _Field(
            f"{name}.npy",
            sizes,
            lambda a, b: pa.array([npy_bytes(np.asarray(v)) for v in values[a:b]], pa.binary()),
        )
    raise SourceError(
        f"array source: {name!r} must be an array, or a sequence of arrays, bytes or str "
        f"(found {type(first).__name__})"
    )


def _npy_rows(ext: str, values: np.ndarray) -> _Field:
    """``.npy`` bytes of each row as one buffer: every row has the same header."""
    n = len(values)
    rows = np.ascontiguousarray(values) if values.ndim > 1 else values
    row = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
    header = npy_bytes(rows[0])[: -row or None] if n else b""
    width = len(header) + row

    def blobs(a: int, b: int) -> pa.Array:
        count = b - a
        out = np.empty((count, width), np.uint8)
        out[:, : len(header)] = np.frombuffer(header, np.uint8)
        body = np.ascontiguousarray(rows[a:b]).reshape(-1).view(np.uint8)
        out[:, len(header) :] = body.reshape(count, row)
        offsets = np.arange(0, (count + 1) * width, width, dtype=np.int32)
        return pa.Array.from_buffers(
            pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(out)]
        )

    return _Field(ext, np.full(n, width, np.int64), blobs)
