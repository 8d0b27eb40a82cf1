"""In-memory arrays as a source: ``shardex.export({"x": xs, "y": ys}, out)``.

Each entry of the mapping is one field of every sample:

* a numpy array of shape ``(N, ...)``: sample ``i`` stores ``array[i]`` (0-d for ``(N,)``)
  with its dtype, as the field ``NAME.npy``;
* a sequence of N numpy arrays (ragged: shapes may differ, dtype and number of
  dimensions may not): stored as ``NAME.npy``;
* a sequence of N ``bytes``: encoded data kept byte-exact, the field named ``NAME``
  (name it by its extension: ``jpg``, ``webp``, ``json`` ...);
* a sequence of N ``str``: stored as ``NAME.txt`` (UTF-8).

Reserved names: ``label`` (class numbers), ``split`` (split names) and ``key`` (sample
keys; default ``000000``, ``000001`` ...).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from shardex.errors import SourceError
from shardex.sources.base import ScanResult, Source, build_table


class ArraySource(Source):
    """Samples made of in-memory arrays, byte strings and strings."""

    kind: ClassVar[str] = "arrays"

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        label_names: Sequence[str] | None = None,
        metadata: pa.Table | None = None,
        uri: str = "arrays",
    ) -> None:
        self.data = dict(data)
        self.label_names = tuple(label_names) if label_names is not None else None
        self.metadata = metadata
        self.uri = uri

    def _length(self) -> int:
        lengths = {name: len(v) for name, v in self.data.items()}
        if not lengths or len(set(lengths.values())) != 1:
            raise SourceError(f"array source: every entry needs the same length, got {lengths}")
        return next(iter(lengths.values()))

    def scan(self) -> ScanResult:
        n = self._length()
        data = dict(self.data)
        keys = [str(k) for k in data.pop("key", [f"{i:06d}" for i in range(n)])]
        labels = data.pop("label", None)
        splits = data.pop("split", None)
        from shardex.rows import binary_array, members_column  # rows imports this package

        exts, columns = [], []
        for name, values in data.items():
            ext, encoded = _encode(name, values)
            exts.append(ext)
            columns.append(binary_array(encoded))
        # built column by column: one Python dict per member costs more than the export
        members = members_column(exts, columns, n)
        table = build_table(
            keys,
            [f"{self.uri}[{i}]" for i in range(n)],
            members,
            splits=None if splits is None else [str(s) for s in splits],
            labels=None if labels is None else [int(v) for v in labels],
            metadata=self.metadata,
        )
        return ScanResult(table, self.label_names)


def npy_bytes(array: Any) -> bytes:
    """``.npy`` bytes of an array, C order (what every backend writes back)."""
    buf = io.BytesIO()
    array = np.asarray(array)
    # ascontiguousarray would make a 0-d array 1-d
    np.save(buf, np.ascontiguousarray(array) if array.ndim else array, allow_pickle=False)
    return buf.getvalue()


def _encode(name: str, values: Any) -> tuple[str, list[bytes]]:
    if isinstance(values, np.ndarray):
        if values.dtype.hasobject:
            raise SourceError(f"array source: {name!r} holds Python objects; use a numeric dtype")
        return f"{name}.npy", [npy_bytes(v) for v in values]
    first = values[0] if len(values) else None
    if isinstance(first, bytes | bytearray | memoryview):
        return name, [bytes(v) for v in values]
    if isinstance(first, str):
        return f"{name}.txt", [str(v).encode() for v in values]
    if isinstance(first, np.ndarray):
        return f"{name}.npy", [npy_bytes(np.asarray(v)) for v in values]
    raise SourceError(
        f"array source: {name!r} must be an array, or a sequence of arrays, bytes or str "
        f"(found {type(first).__name__})"
    )
