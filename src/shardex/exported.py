"""``ExportedDataset``: NexuML's config record of training data, an export as (features,
labels) by logical key (``image``, ``label``, ``NAME`` of ``NAME.npy``, a metadata column),
so one definition reads any backend.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from shardex.api import open_dataset
from shardex.dataset import Dataset, Sample
from shardex.errors import ConfigError
from shardex.fields import field_key

if TYPE_CHECKING:
    from shardex.contract import ExportConfig


@dataclass(frozen=True)
class ExportedDataset:
    """An export's samples as ``{"key", "split", "features": {...}, "labels": {...}}``.

    Args:
        root: the export's folder or URL.
        split: one split; default: every split, in ``export_index`` order.
        feature_keys: keys of the inputs; default: the export's ``x_keys``.
        label_keys: keys of the targets; default: the export's ``y_keys``.
        decode: images to arrays, labels to int, ``.npy`` to arrays (default), or raw bytes.
        storage_options: options for object storage (see docs/storage.md).
        s3_endpoint_url, s3_region, s3_profile: the CLI's ``--s3-*`` flags; they override
            ``storage_options``.

    Metadata lists of numbers come back as numpy arrays, so a batch holds one tensor.
    """

    root: str | os.PathLike[str]
    split: str | None = None
    feature_keys: tuple[str, ...] | None = None
    label_keys: tuple[str, ...] | None = None
    decode: bool = True
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    s3_endpoint_url: str | None = field(default=None, repr=False)
    s3_region: str | None = field(default=None, repr=False)
    s3_profile: str | None = field(default=None, repr=False)

    @property
    def options(self) -> dict[str, Any] | None:
        """``storage_options`` with the ``s3_*`` arguments folded in."""
        flags = {
            "endpoint_url": self.s3_endpoint_url,
            "region": self.s3_region,
            "profile": self.s3_profile,
        }
        given = {k: v for k, v in flags.items() if v is not None}
        return {**(self.storage_options or {}), **given} or None

    @cached_property
    def datasets(self) -> dict[str, Dataset]:
        names = (self.split,) if self.split is not None else tuple(self._config.splits)
        out = {
            name: open_dataset(
                self.root, split=name, decode=self.decode, storage_options=self.options
            )
            for name in names
        }
        known = self._known(next(iter(out.values())))
        for key in (*self.features, *self.labels):
            if key not in known:
                raise ConfigError(
                    f"key {key!r} is not in the export {os.fspath(self.root)} "
                    f"(keys: {', '.join(sorted(known))})"
                )
        return out

    @property
    def dataset(self) -> Dataset:
        """The underlying dataset, when one split is read."""
        datasets = self.datasets
        if len(datasets) != 1:
            raise ConfigError(
                f"{os.fspath(self.root)} is read over {len(datasets)} splits "
                f"({', '.join(datasets)}); use .datasets, or name one with split="
            )
        return next(iter(datasets.values()))

    @property
    def features(self) -> tuple[str, ...]:
        return self.feature_keys if self.feature_keys is not None else self._config.x_keys

    @property
    def labels(self) -> tuple[str, ...]:
        return self.label_keys if self.label_keys is not None else self._config.y_keys

    @cached_property
    def _config(self) -> ExportConfig:
        from shardex.api import read_config
        from shardex.storage import open_storage

        return read_config(open_storage(self.root, self.options))

    def _known(self, ds: Dataset) -> set[str]:
        return {field_key(f.name) for f in ds.config.fields} | set(self._columns(ds))

    def _columns(self, ds: Dataset) -> list[str]:
        """Metadata columns asked for that are not stored fields."""
        fields = {field_key(f.name) for f in ds.config.fields}
        wanted = [k for k in (*self.features, *self.labels) if k not in fields]
        return [c for c in wanted if c in ds.metadata.column_names]

    @cached_property
    def _metadata(self) -> dict[str, pa.Table]:
        return {name: ds.metadata.select(self._columns(ds)) for name, ds in self.datasets.items()}

    @cached_property
    def _order(self) -> tuple[np.ndarray, np.ndarray]:
        """(split number, index in its split) of each item, merged by ``export_index``."""
        parts = list(self.datasets.values())
        splits = np.concatenate([np.full(len(ds), n, np.int32) for n, ds in enumerate(parts)])
        local = np.concatenate([np.arange(len(ds), dtype=np.int64) for ds in parts])
        if len(parts) > 1:
            numbers = np.concatenate(
                [ds.metadata.column("export_index").to_numpy() for ds in parts]
            )
            order = np.argsort(numbers, kind="stable")
            splits, local = splits[order], local[order]
        return splits, local

    def __len__(self) -> int:
        return sum(len(ds) for ds in self.datasets.values())

    def locate(self, index: int) -> tuple[str, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample {index} is out of range for {n} samples")
        splits, local = self._order
        index %= n
        return tuple(self.datasets)[int(splits[index])], int(local[index])

    def _pick(
        self, split: str, index: int, sample: Sample, keys: tuple[str, ...]
    ) -> dict[str, Any]:
        by_key = {field_key(name): v for name, v in sample.items() if name != "__key__"}
        table = self._metadata[split]
        return {
            key: by_key[key] if key in by_key else meta_value(table.column(key), index)
            for key in keys
        }

    def __getitem__(self, index: int) -> dict[str, Any]:
        split, local = self.locate(index)
        sample = self.datasets[split][local]
        return {
            "key": sample["__key__"],
            "split": split,
            "features": self._pick(split, local, sample, self.features),
            "labels": self._pick(split, local, sample, self.labels),
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def meta_value(column: pa.ChunkedArray, index: int) -> Any:
    """One metadata value; a list of numbers as a numpy array (collated into one tensor)."""
    scalar = column[index]
    kind = column.type
    if (
        scalar.is_valid
        and (pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind))
        and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type))
    ):
        # writable: torch warns on (and may write to) a read-only array
        return scalar.values.to_numpy(zero_copy_only=False, writable=True)
    return scalar.as_py()
