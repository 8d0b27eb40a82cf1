"""A Hugging Face ``Dataset``/``DatasetDict`` (or ``save_to_disk`` folder) as a source: the
``Image`` column's encoded bytes (never decoded), ``ClassLabel`` labels, its splits, and
the other columns as metadata (``hf_<name>`` where shardex uses the name). Needs
``pip install datasets``; importing shardex does not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import sniffed_extension
from shardex.errors import EmptySourceError, MissingDependencyError, SourceError
from shardex.refs.scan import LeftOut, SampleStream, ScanBatch, batch_table, members_array
from shardex.sources.base import Source, check_batch_size, check_metadata_names, quoted, safe_key
from shardex.sources.probe import SourceSpec

_BATCH_BYTES: Final = 1 << 30  # the member data column has 32-bit offsets
_RENAMED: Final = ("original_path", "split", "label")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError(
            "a Hugging Face dataset as a source needs the datasets package: pip install datasets"
        ) from exc
    return datasets


class HFSource(Source):
    """A ``datasets.Dataset`` or ``DatasetDict``, or the folder ``save_to_disk`` wrote."""

    kind: ClassVar[str] = "huggingface"

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        return cls(spec.value if spec.text is None else spec.path)

    def __init__(self, dataset: Any, *, uri: str | None = None, batch_size: int = 1024) -> None:
        datasets = _datasets()
        if isinstance(dataset, str | os.PathLike):
            uri = uri or os.fspath(dataset)
            dataset = _load_saved(datasets, Path(dataset))
        if isinstance(dataset, datasets.DatasetDict):
            self.splits: dict[str | None, Any] = dict(dataset.items())
        elif isinstance(dataset, datasets.Dataset):
            self.splits = {None: dataset}
        else:
            raise SourceError(
                f"expected a datasets.Dataset or DatasetDict, got {type(dataset).__name__}"
            )
        self.uri = uri or f"huggingface:{type(dataset).__name__}"
        if not any(len(ds) for ds in self.splits.values()):
            raise EmptySourceError(f"the Hugging Face dataset {quoted(self.uri)} holds no samples")
        self.batch_size = check_batch_size(batch_size)
        first = next(iter(self.splits.values()))
        self.image, self.label, self.label_names = _roles(first.features, datasets, self.uri)
        for name, ds in self.splits.items():
            if ds.features != first.features:
                raise SourceError(
                    f"split {name!r} of {quoted(self.uri)} has other features than the "
                    "first split; give the splits one schema (datasets.concatenate ...)"
                )
        self.key = "key" if "key" in first.column_names else None
        other = [c for c in first.column_names if c not in (self.image, self.label, self.key)]
        where = f"Hugging Face dataset {quoted(self.uri)}"
        check_metadata_names(other, where)
        self.metadata_columns = other
        self.metadata_names = [f"hf_{c}" if c in _RENAMED else c for c in other]
        if len(set(self.metadata_names)) < len(other):
            clash = next(c for c in other if c in _RENAMED and f"hf_{c}" in other)
            raise SourceError(
                f"{where}: column {clash!r} is reserved by shardex and is kept as "
                f"'hf_{clash}', but the dataset has that column too; rename one of them"
            )

    def stream(self) -> SampleStream:
        return SampleStream(self._batches(), self.label_names)

    def _batches(self) -> Iterator[ScanBatch]:
        for split, ds in self.splits.items():
            arrow = ds.with_format("arrow")
            start = 0
            while start < len(ds):
                table = arrow[start : start + self.batch_size]
                table = _within_bytes(table, self.image)
                yield self._batch(split, start, table)
                start += table.num_rows

    def _batch(self, split: str | None, start: int, table: pa.Table) -> ScanBatch:
        rows = range(start, start + table.num_rows)
        prefix = "" if split is None else f"{split}/"
        keys = [f"{prefix}{i:08d}" for i in rows]
        origin = [f"{self.uri}[{split or ''}][{i}]" for i in rows]
        left_out: list[LeftOut] = []
        given = table.column(self.key).to_pylist() if self.key else [None] * len(keys)
        found: list[tuple[str, str | None, bytes | None]] = []
        offsets = [0]
        for i, image in enumerate(table.column(self.image).to_pylist()):
            if given[i] is not None:
                keys[i] = safe_key(str(given[i]))
            member = "the row's key is null" if self.key and given[i] is None else _member(image)
            if isinstance(member, str):
                left_out.append(LeftOut(origin[i], member, key=keys[i]))
            elif member is not None:
                found.append(member)
                origin[i] = member[1] or origin[i]
            offsets.append(len(found))
        kept = [i for i in range(len(keys)) if offsets[i + 1] > offsets[i]]
        if len(kept) < len(keys):  # rows left out have no member: drop them from the table
            table = table.take(pa.array(kept, pa.int64()))
            keys, origin = [keys[i] for i in kept], [origin[i] for i in kept]
            offsets = [0, *[offsets[i + 1] for i in kept]]
        ext, path, data = (list(c) for c in zip(*found, strict=True)) if found else ([], [], [])
        size = [os.path.getsize(p) if d is None and p else len(d or b"") for _, p, d in found]
        members = members_array(offsets, ext, path, [-1] * len(found), size, data)
        labels = None
        if self.label:
            # datasets writes -1 for "no label" (unlabelled test splits): shardex's null
            column = table.column(self.label)
            labels = pc.if_else(pc.less(column, 0), pa.scalar(None, column.type), column)
        return ScanBatch(
            batch_table(
                keys,
                origin,
                members,
                splits=None if split is None else [split] * len(keys),
                labels=labels,
                metadata=table.select(self.metadata_columns).rename_columns(self.metadata_names),
            ),
            tuple(left_out),
        )


def _roles(
    features: Any, datasets: Any, uri: str
) -> tuple[str, str | None, tuple[str, ...] | None]:
    images = [n for n, f in features.items() if isinstance(f, datasets.Image)]
    if not images:
        images = [n for n, f in features.items() if _is_image_struct(f, datasets)]
    if not images:
        raise SourceError(
            f"the Hugging Face dataset {quoted(uri)} has no Image column (nor a column of "
            "{bytes, path} structs): cast the images' column to datasets.Image()"
        )
    if len(images) > 1:
        raise SourceError(
            f"the dataset has {len(images)} Image columns ({', '.join(images)}); shardex "
            "exports one: select it (dataset.remove_columns([...]))"
        )
    labels = [n for n, f in features.items() if isinstance(f, datasets.ClassLabel)]
    label = "label" if "label" in labels else (labels[0] if labels else None)
    names = tuple(features[label].names) if label else None
    if label is None and isinstance(features.get("label"), datasets.Value):
        label = "label" if pa.types.is_integer(features["label"].pa_type) else None
    return images[0], label, names


def _is_image_struct(feature: Any, datasets: Any) -> bool:
    return (
        isinstance(feature, dict)
        and set(feature) == {"bytes", "path"}
        and isinstance(feature["bytes"], datasets.Value)
        and feature["bytes"].dtype in ("binary", "large_binary")
    )


def _load_saved(datasets: Any, path: Path) -> Any:
    """``datasets.load_from_disk``, leaving out saved splits of no rows (which it fails to load)."""
    try:
        if (path / "dataset_dict.json").is_file():
            names = json.loads((path / "dataset_dict.json").read_text())["splits"]
            loaded = {name: _load_saved(datasets, path / name) for name in names}
            return datasets.DatasetDict({k: v for k, v in loaded.items() if len(v)})
        if not json.loads((path / "state.json").read_text()).get("_data_files"):
            return datasets.Dataset.from_dict({})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(
            f"{quoted(str(path))} is not a readable save_to_disk folder ({exc})"
        ) from exc
    return datasets.load_from_disk(str(path))


def _member(image: dict[str, Any] | None) -> tuple[str, str | None, bytes | None] | str | None:
    """(ext, path, inline bytes) of an Image value, or why it cannot be exported."""
    if image is None:
        return "the row has no image (null)"
    data, path = image.get("bytes"), image.get("path")
    if data is not None:
        ext = sniffed_extension(data[:16])
        if ext is None:
            return "the image bytes are not a known image format"
        return ext, None, data
    if path and Path(path).is_file():
        with open(path, "rb") as f:
            ext = sniffed_extension(f.read(16))
        if ext is None:
            return f"{quoted(path)} is not a known image format"
        return ext, path, None
    return f"the image file {quoted(str(path))} does not exist"


def _within_bytes(table: pa.Table, image: str | None) -> pa.Table:
    """The first rows of ``table`` whose inline image bytes stay addressable (at least one)."""
    if image is None:
        return table
    sizes = pc.fill_null(pc.binary_length(pc.struct_field(table.column(image), "bytes")), 0)
    over = np.flatnonzero(np.cumsum(sizes.to_numpy()) > _BATCH_BYTES)
    return table.slice(0, max(1, int(over[0]))) if len(over) else table
