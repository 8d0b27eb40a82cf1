"""``ExportedDataset``: an export's split as (features, labels) by key name, for configs.

NexuML users describe training data as ``ExportedDataset(root, split, feature_keys,
label_keys)`` in a config file; this is that record. Keys are the export's logical keys
(``image``, ``label``, ``NAME`` of an array field ``NAME.npy``, or any metadata column), so
the same definition reads an export of any backend.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa

from shardex.api import open_dataset
from shardex.dataset import Dataset, Sample
from shardex.errors import ConfigError
from shardex.fields import field_key


@dataclass(frozen=True)
class ExportedDataset:
    """A split of an export as ``{"features": {...}, "labels": {...}}`` samples.

    Args:
        root: the export's folder or URL.
        split: the split, as exported (never re-split); default: the only split (as
            :func:`shardex.open_dataset`; an export of several splits needs one named).
        feature_keys: keys of the inputs; default: the export's ``x_keys``.
        label_keys: keys of the targets; default: the export's ``y_keys``.
        decode: images to arrays, labels to int, ``.npy`` to arrays (default), or raw bytes.
        storage_options: options for object storage (see docs/storage.md).
        s3_endpoint_url, s3_region, s3_profile: the CLI's ``--s3-*`` flags, for configs that
            spell them so; they override the same keys of ``storage_options``.

    Metadata columns come back as Python values, except lists of numbers (embeddings),
    which come back as one numpy array per sample, so that a ``DataLoader`` batch holds one
    ``(batch, dim)`` tensor instead of ``dim`` tensors.
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
    def dataset(self) -> Dataset:
        """The underlying shardex dataset (any backend)."""
        ds = open_dataset(
            self.root, split=self.split, decode=self.decode, storage_options=self.options
        )
        known = self._known(ds)
        for key in (*self.features, *self.labels):
            if key not in known:
                raise ConfigError(
                    f"key {key!r} is not in the export {os.fspath(self.root)} "
                    f"(keys: {', '.join(sorted(known))})"
                )
        return ds

    @property
    def features(self) -> tuple[str, ...]:
        return self.feature_keys if self.feature_keys is not None else self._config.x_keys

    @property
    def labels(self) -> tuple[str, ...]:
        return self.label_keys if self.label_keys is not None else self._config.y_keys

    @cached_property
    def _config(self) -> Any:
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
    def _metadata(self) -> pa.Table:
        ds = self.dataset
        return ds.metadata.select(self._columns(ds))

    def __len__(self) -> int:
        return len(self.dataset)

    def _pick(self, index: int, sample: Sample, keys: tuple[str, ...]) -> dict[str, Any]:
        by_key = {field_key(name): v for name, v in sample.items() if name != "__key__"}
        out = {}
        for key in keys:
            out[key] = by_key[key] if key in by_key else _value(self._metadata.column(key), index)
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample {index} is out of range for a split of {n} samples")
        index %= n
        sample = self.dataset[index]
        return {
            "key": sample["__key__"],
            "features": self._pick(index, sample, self.features),
            "labels": self._pick(index, sample, self.labels),
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self) -> dict[str, Any]:
        fields = (
            "root",
            "split",
            "feature_keys",
            "label_keys",
            "decode",
            "storage_options",
            "s3_endpoint_url",
            "s3_region",
            "s3_profile",
        )
        return {name: getattr(self, name) for name in fields}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def _value(column: pa.ChunkedArray, index: int) -> Any:
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
