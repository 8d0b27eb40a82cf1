"""In-memory arrays as a source: ``shardex.export({"x": xs, "y": ys}, out)``. Each entry is
a field: arrays (or ragged ones) as ``NAME.npy``, bytes kept as ``NAME``, str as
``NAME.txt``; ``label``, ``split`` and ``key`` are reserved.
"""

from __future__ import annotations

import io
import mmap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.errors import SourceError
from shardex.refs.scan import SampleStream, ScanBatch, batch_table, members_array
from shardex.sources.base import DEFAULT_BATCH_SIZE, Source, check_batch_size
from shardex.sources.probe import SourceSpec

_BATCH_BYTES: Final = 1 << 30  # Arrow's binary offsets are 32-bit
_BINARY_MAX: Final = (1 << 31) - 1
_HUGE_PAGE: Final = 1 << 21  # below this, a mapping of our own gains nothing


class ArraySource(Source):
    """Samples made of in-memory arrays, byte strings and strings."""

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
        fields = [_encode(name, values) for name, values in data.items()]
        return SampleStream(self._batches(n, fields, keys, labels, splits), self.label_names)

    def _batches(
        self, n: int, fields: list[_Field], keys: Any, labels: Any, splits: Any
    ) -> Iterator[ScanBatch]:
        label_column = None if labels is None else _labels(labels)
        sizes = sum((f.sizes for f in fields), np.zeros(n, np.int64))
        for start, stop in _bounds(sizes, self.batch_size):
            blobs = [f.blobs(start, stop) for f in fields]
            count = stop - start
            table = batch_table(
                _keys(keys, start, stop),
                [f"{self.uri}[{i}]" for i in range(start, stop)],
                _members([f.ext for f in fields], blobs, count),
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


def _members(exts: list[str], blobs: list[pa.Array], count: int) -> pa.Array:
    """Each sample's members (one per field, in field order)."""
    if not blobs:
        return members_array(np.zeros(count + 1, np.int32), [], [], [], [])
    width = len(blobs)
    if width == 1:
        data = blobs[0]
    else:
        order = np.arange(count * width).reshape(width, count).T.ravel()
        data = pa.concat_arrays(blobs).take(pa.array(order))
    data = data.combine_chunks() if isinstance(data, pa.ChunkedArray) else data
    return members_array(
        np.arange(0, count * width + 1, width, dtype=np.int32),
        exts * count if width > 1 else [exts[0]] * count,
        None,
        np.full(count * width, -1, np.int64),
        pc.binary_length(data),
        data,
    )


def binary_array(values: Sequence[bytes], sizes: np.ndarray) -> pa.Array:
    """A ``binary`` array of ``values`` copied into one anonymous mapping in huge pages: Arrow's
    pool faults a page per 4 KiB (2.3-2.5 CPU s for 324 MB of JPEGs, against 0.1-0.5 s). Under
    one huge page Arrow's pool serves (a mapping per tiny batch would waste memory).
    """
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    if total > _BINARY_MAX or total < _HUGE_PAGE:
        return pa.array(values, pa.binary())
    memory = _anonymous(total)
    view = memoryview(memory)
    at = offsets.tolist()
    for i, value in enumerate(values):
        view[at[i] : at[i + 1]] = value
    view.release()
    return pa.Array.from_buffers(
        pa.binary(),
        len(values),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(memory)],
    )


def _anonymous(size: int) -> mmap.mmap:
    """Private anonymous memory, in huge pages where the kernel gives them on request."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    memory = mmap.mmap(-1, max(size, 1), **({"flags": private} if private else {}))
    hugepage = getattr(mmap, "MADV_HUGEPAGE", None)
    if hugepage is not None and size >= _HUGE_PAGE:
        memory.madvise(hugepage)
    return memory


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
    blobs: Callable[[int, int], pa.Array]


def _encode(name: str, values: Any) -> _Field:
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
            values = [bytes(v) for v in values]
        sizes = np.fromiter(map(len, values), np.int64, len(values))
        return _Field(name, sizes, lambda a, b: binary_array(values[a:b], sizes[a:b]))
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
