"""What the browser knows of a split without reading an image, vectorised over the metadata.

Sort orders and the last few selections are kept: paging a filtered grid never refilters.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.browse.query import Mask, Query, query_mask
from shardex.browse.table import SplitTable
from shardex.contract import ExportConfig
from shardex.errors import SampleNotFoundError
from shardex.refs.scan import INVALID, MEMBERS, RESERVED

Indices = npt.NDArray[np.int64]
#: Columns shardex adds to every export: shown on the sample page, not offered as filters.
INTERNAL: Final = RESERVED - {"key", "original_path", "label", MEMBERS, INVALID}
#: Names a grid row uses for itself: a column so named (``index`` from
#: ``df.reset_index()``) is not offered under the thumbnails, where the row's value shows.
ROW_FIELDS: Final = frozenset({"index", "label_name"})
BINS: Final = 30
SIZE_BINS: Final = 24
#: A filtered 1M-row selection holds up to 8 MB of indices.
SELECTIONS_KEPT: Final = 8
GRID_TEXT: Final = 200
#: Integers past this lose precision as JavaScript numbers: they are sent as strings.
_JS_SAFE: Final = 2**53


@dataclass(frozen=True, slots=True)
class Columns:
    """The kind of each metadata column, as the browser uses it."""

    label: str | None  # integer class numbers
    label_names: tuple[str, ...]
    numeric: tuple[str, ...]  # scalar numbers: ranges, order, histograms
    text: tuple[str, ...]  # strings (the key first): text match
    embeddings: tuple[str, ...]  # fixed-size lists of floats: similar images
    orderable: tuple[str, ...]  # numeric, and the export's own order

    @classmethod
    def of(cls, schema: pa.Schema, config: ExportConfig) -> Columns:
        integers = {f.name for f in schema if pa.types.is_integer(f.type)}
        label = next((k for k in config.y_keys if k in integers), None)
        user = [f for f in schema if f.name not in INTERNAL and f.name not in (label, "key")]
        numeric = [
            f.name for f in user if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
        ]
        text = [f.name for f in user if pa.types.is_string(f.type)]
        embeddings = [
            f.name
            for f in user
            if pa.types.is_fixed_size_list(f.type)
            and pa.types.is_floating(f.type.value_type)
            and f.type.list_size >= 2
        ]
        return cls(
            label,
            tuple(config.label_names or ()) if label else (),
            tuple(numeric),
            ("key", *text) if "key" in schema.names else tuple(text),
            tuple(embeddings),
            ("export_index", *numeric) if "export_index" in schema.names else tuple(numeric),
        )

    @property
    def shown(self) -> tuple[str, ...]:
        """Columns the grid may show under a thumbnail."""
        shown = (*self.numeric, *(t for t in self.text if t != "key"))
        return tuple(name for name in shown if name not in ROW_FIELDS)


@dataclass(frozen=True, slots=True)
class Selection:
    """The samples a query keeps, in display order, and the label counts beside it."""

    indices: Indices
    label_counts: dict[int, int]


class Catalog:
    """The metadata of one split, queried by the browser (thread-safe)."""

    def __init__(self, metadata: SplitTable, config: ExportConfig, split: str) -> None:
        self.metadata, self.config, self.split = metadata, config, split
        self.table = table = metadata.table
        self.num_rows = table.num_rows
        self.columns = Columns.of(metadata.schema, config)
        self._keys = table.column("key") if "key" in table.column_names else None
        label = self.columns.label
        self._labels = _as_numpy(table.column(label), -1, np.int64) if label else None
        self._lock = threading.Lock()
        self._orders: dict[tuple[str, bool], Indices] = {}
        self._selections: OrderedDict[Query, Selection] = OrderedDict()
        self._numbers: dict[str, npt.NDArray[np.float64]] = {}
        self._ranges: dict[str, tuple[float, float] | None] = {}

    def select(self, query: Query) -> Selection:
        """The samples ``query`` keeps, ordered; kept for the next page of the same query."""
        with self._lock:
            if query in self._selections:
                self._selections.move_to_end(query)
                return self._selections[query]
        base = query_mask(self.table, query.filters(), self.columns.label)
        mask = base
        if query.labels:
            mask = query_mask(self.table, Query(labels=query.labels), self.columns.label) & base
        if query.order:
            order = self._order(query.order, query.descending)
            indices = order[mask[order]]
        else:
            indices = np.flatnonzero(mask).astype(np.int64)
        selection = Selection(indices, self._label_counts(base))
        with self._lock:
            self._selections[query] = selection
            while len(self._selections) > SELECTIONS_KEPT:
                self._selections.popitem(last=False)
        return selection

    def rows(self, indices: Indices, columns: tuple[str, ...]) -> list[dict[str, Any]]:
        """Grid rows: sample number, key, label and the chosen columns, JSON-ready."""
        wanted = [c for c in ("key", self.columns.label, *columns) if c]
        taken = self.table.select(list(dict.fromkeys(wanted))).take(pa.array(indices))
        out = []
        for number, row in zip(indices.tolist(), taken.to_pylist(), strict=True):
            cells = {name: json_value(v, GRID_TEXT) for name, v in row.items()}
            cells["index"] = number
            if self.columns.label:
                cells["label_name"] = self.label_name(row[self.columns.label])
            out.append(cells)
        return out

    def row(self, index: int) -> dict[str, Any]:
        """Every metadata value of sample ``index``, JSON-ready, strings whole."""
        return {name: json_value(v, None) for name, v in self.metadata.row(index).items()}

    def label_name(self, label: Any) -> str:
        names = self.columns.label_names
        if isinstance(label, int) and 0 <= label < len(names):
            return names[label]
        return "" if label is None else str(label)

    def find(self, key: str) -> int:
        """The sample number of ``key``. Raises SampleNotFoundError."""
        found = -1 if self._keys is None else pc.index(self._keys, key).as_py()
        if found < 0:
            raise SampleNotFoundError(f"no sample with key {key!r} in split {self.split!r}")
        return int(found)

    def plots(self, selection: Selection) -> dict[str, Any]:
        """Data of the plots over a selection: labels, histograms, sizes, shards."""
        mask: Mask | None = None  # everything: no copy of each column through a mask
        if selection.indices.size != self.num_rows:
            mask = np.zeros(self.num_rows, dtype=bool)
            mask[selection.indices] = True
        histograms = {name: self._histogram(name, mask) for name in self.columns.numeric}
        shards = self.config.split(self.split).shards
        return {
            "total": int(selection.indices.size),
            "label_counts": {str(k): v for k, v in selection.label_counts.items()},
            "labels": self._label_plot(selection),
            "histograms": histograms,
            "sizes": self._sizes(mask),
            "shards": [
                {"name": s.path.rpartition("/")[2], "bytes": s.num_bytes, "samples": s.num_samples}
                for s in shards
            ],
        }

    def numbers(self, column: str) -> npt.NDArray[np.float64]:
        """A numeric column as float64, NaN where missing (made once)."""
        with self._lock:
            values = self._numbers.get(column)
        if values is None:
            values = _as_numpy(
                pc.cast(self.table.column(column), pa.float64()), math.nan, np.float64
            )
            with self._lock:
                self._numbers[column] = values
        return values

    def _order(self, column: str, descending: bool) -> Indices:
        with self._lock:
            order = self._orders.get((column, descending))
        if order is None:
            values = self.numbers(column)
            # stable, and NaN (a missing value) sorts last either way
            order = np.argsort(-values if descending else values, kind="stable").astype(np.int64)
            with self._lock:
                self._orders[(column, descending)] = order
        return order

    def _label_counts(self, mask: Mask) -> dict[int, int]:
        if self._labels is None:
            return {}
        labels = self._labels[mask]
        labels = labels[labels >= 0]
        if labels.size and labels.max() < 1 << 16:
            counts = np.bincount(labels)
            return {int(i): int(c) for i, c in enumerate(counts) if c}
        values, counts = np.unique(labels, return_counts=True)
        return dict(zip(values.tolist(), counts.tolist(), strict=True))

    def _label_plot(self, selection: Selection) -> list[dict[str, Any]]:
        if self._labels is None:
            return []
        mask = np.zeros(self.num_rows, dtype=bool)
        mask[selection.indices] = True
        return [
            {"label": label, "name": self.label_name(label), "count": count}
            for label, count in sorted(self._label_counts(mask).items())
        ]

    def _bounds(self, column: str) -> tuple[float, float] | None:
        """The finite range of a numeric column: bins span it, filtered or not."""
        with self._lock:
            if column in self._ranges:
                return self._ranges[column]
        values = self.numbers(column)
        finite = values[np.isfinite(values)]
        bounds = None
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
            bounds = (lo, hi if hi > lo else lo + 1.0)
        with self._lock:
            self._ranges[column] = bounds
        return bounds

    def _kept(self, column: str, mask: Mask | None) -> npt.NDArray[np.float64]:
        values = self.numbers(column)
        return values if mask is None else values[mask]

    def _histogram(self, column: str, mask: Mask | None) -> dict[str, Any]:
        bounds = self._bounds(column)
        if bounds is None:
            return {"edges": [], "counts": []}
        values = self._kept(column, mask)
        counts, edges = np.histogram(values[np.isfinite(values)], bins=BINS, range=bounds)
        return {"edges": edges.tolist(), "counts": counts.tolist()}

    def _sizes(self, mask: Mask | None) -> dict[str, Any] | None:
        if not {"width", "height"} <= set(self.columns.numeric):
            return None
        w_bounds, h_bounds = self._bounds("width"), self._bounds("height")
        if w_bounds is None or h_bounds is None:
            return None
        w, h = self._kept("width", mask), self._kept("height", mask)
        finite = np.isfinite(w) & np.isfinite(h)
        # bin numbers by arithmetic and one bincount: several times faster than histogram2d
        wi, hi = _bin(w[finite], w_bounds), _bin(h[finite], h_bounds)
        counts = np.bincount(wi * SIZE_BINS + hi, minlength=SIZE_BINS * SIZE_BINS)
        return {
            "width_edges": np.linspace(*w_bounds, SIZE_BINS + 1).tolist(),
            "height_edges": np.linspace(*h_bounds, SIZE_BINS + 1).tolist(),
            "counts": counts.reshape(SIZE_BINS, SIZE_BINS).tolist(),
        }


def _bin(values: npt.NDArray[np.float64], bounds: tuple[float, float]) -> npt.NDArray[np.int64]:
    lo, hi = bounds
    scaled = (values - lo) * (SIZE_BINS / (hi - lo))
    return np.clip(scaled.astype(np.int64), 0, SIZE_BINS - 1)


def json_value(value: Any, cut: int | None) -> Any:
    """A metadata value as JSON carries it (NaN and ints past 2**53 as text, strings cut)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _JS_SAFE:
        return str(value)
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, str) and cut is not None and len(value) > cut:
        return value[:cut] + "…"
    if isinstance(value, list):
        return [json_value(v, cut) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v, cut) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)  # dates, decimals


def _as_numpy(column: pa.ChunkedArray, missing: Any, dtype: Any) -> Any:
    filled = pc.fill_null(column, missing) if column.null_count else column
    return np.asarray(filled.to_numpy(), dtype=dtype)
