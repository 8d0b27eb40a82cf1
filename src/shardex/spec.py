"""``DataSpec``: what a training loop reads, declared once (NexuML's data spec).

.. code-block:: python

    from shardex.spec import DataSpec, ExportedDataset, LoaderSpec, TorchLoader

    spec = DataSpec(
        source=ExportedDataset(root="./exported-data", feature_keys=["embedding"],
                               label_keys=["label"]),
        loader=LoaderSpec(backend=TorchLoader(batch_size=32, num_workers=2)),
        preprocessing=[{"stage": "decode"}, {"stage": "resize", "size": 64}],
    )
    for inputs, targets in spec:  # dicts of tensors, by key
        ...

``preprocessing`` stages run in the loader's workers; :meth:`DataSpec.materialize` runs
them in an export instead, and ``skip_pipeline_stages`` skips what the export already ran.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from shardex.contract import ExportConfig
from shardex.errors import ConfigError
from shardex.exported import ExportedDataset, meta_value
from shardex.fields import field_key
from shardex.pipeline.stage import Sample, Stage

__all__ = [
    "DALILoader",
    "DataSpec",
    "ExportedDataset",
    "LoaderSpec",
    "TensorShardsLoader",
    "TorchLoader",
]


@dataclass(frozen=True, slots=True)
class _Epochs:
    """Options both torch loaders share (``rank``/``world_size`` default to torch's)."""

    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    state: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TorchLoader(_Epochs):
    """A ``DataLoader`` with a :class:`~shardex.torch.ShardexSampler`, over any backend.

    ``state`` is a ``sampler.state_dict()`` to resume from; ``collate_fn`` defaults to
    :func:`shardex.torch.collate`.
    """

    num_workers: int = 0
    collate_fn: Callable[[list[Any]], Any] | None = None

    def build(self, spec: DataSpec) -> Any:
        from torch.utils.data import DataLoader

        from shardex.torch import ShardexSampler, collate

        items = spec.items
        sampler = ShardexSampler(
            len(items),
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
        )
        if self.state is not None:
            sampler.load_state_dict(self.state)
        return DataLoader(
            items,  # type: ignore[arg-type]  # a map-style dataset with __getitems__
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            drop_last=self.drop_last,
            collate_fn=self.collate_fn or collate,
        )


@dataclass(frozen=True, slots=True)
class TensorShardsLoader(_Epochs):
    """:class:`shardex.torch.TensorShardsLoader` (whole-shard windows, one split)."""

    shards_per_window: int = 6
    prefetch_windows: int = 2

    def build(self, spec: DataSpec) -> _Windows:
        from shardex.torch import TensorShardsLoader as Windows

        spec.refuse_stages("TensorShardsLoader")
        source = spec.source
        split = spec.one_split("TensorShardsLoader")
        loader = Windows(
            source.root,
            self.batch_size,
            split=split,
            shards_per_window=self.shards_per_window,
            prefetch_windows=self.prefetch_windows,
            shuffle_shards=self.shuffle,
            shuffle_samples=self.shuffle,
            drop_last=self.drop_last,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
            storage_options=source.options,
        )
        if self.state is not None:
            loader.load_state_dict(self.state)
        return _Windows(loader, spec, split)


@dataclass(frozen=True, slots=True)
class DALILoader:
    """:func:`shardex.dali.batches` over one split; ``rank``/``world_size`` are DALI's
    ``shard_id``/``num_shards``."""

    batch_size: int = 32
    num_threads: int = 4
    device_id: int | None = None
    shuffle: bool = False
    seed: int | None = None
    rank: int = 0
    world_size: int = 1
    image_size: tuple[int, int] | None = None
    shard_root: str | os.PathLike[str] | None = None

    def build(self, spec: DataSpec) -> Iterator[dict[str, Any]]:
        import shardex.dali

        spec.refuse_stages("DALILoader")
        source = spec.source
        return shardex.dali.batches(
            source.root,
            spec.one_split("DALILoader"),
            features=source.features,
            labels=source.labels,
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device_id,
            random_shuffle=self.shuffle,
            seed=self.seed,
            shard_id=self.rank,
            num_shards=self.world_size,
            image_size=self.image_size,
            shard_root=self.shard_root,
            storage_options=source.options,
        )


Backend = TorchLoader | TensorShardsLoader | DALILoader


@dataclass(frozen=True, slots=True)
class LoaderSpec:
    """Which loader reads the data."""

    backend: Backend = field(default_factory=TorchLoader)


@dataclass(frozen=True)
class DataSpec:
    """An export, the loader that reads it and the stages run on what it loads.

    Args:
        source: the export and its input (``feature_keys``) and target keys.
        loader: the loader backend (default: :class:`TorchLoader`).
        preprocessing: stages (objects or spec-file entries), run on each loaded batch;
            keys may name what they produce.
        skip_pipeline_stages: leave out the stages config.yaml records the export ran
            (they must be the first ones declared, with the same parameters).
    """

    source: ExportedDataset
    loader: LoaderSpec = field(default_factory=LoaderSpec)
    preprocessing: Sequence[Stage | Mapping[str, Any]] = ()
    skip_pipeline_stages: bool = False

    def dataloader(self) -> Any:
        """Batches ``{"key", "split", "features", "labels"}`` (no ``split`` from DALI and
        window loaders)."""
        return self.loader.backend.build(self)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """One pass: ``(inputs, targets)`` per batch, each a dict by key."""
        for batch in self.dataloader():
            yield batch["features"], batch["labels"]

    @cached_property
    def stages(self) -> list[Stage]:
        from shardex.pipeline.onload import declared, stages_to_run

        stages = declared(self.preprocessing)
        if not self.skip_pipeline_stages or not stages:
            return stages
        asked = {*self.source.features, *self.source.labels}
        where = os.fspath(self.source.root)
        return stages_to_run(stages, self.source._config, self._stored, asked, where)

    @cached_property
    def _stored(self) -> set[str]:
        config = self.source._config
        raw = dataclasses.replace(self.source, feature_keys=(), label_keys=())
        columns = next(iter(raw.datasets.values())).metadata.column_names
        return {field_key(f.name) for f in config.fields} | set(columns) | {"key", "split"}

    @cached_property
    def items(self) -> SpecItems:
        return SpecItems(self.source, self.stages, self._stored)

    def refuse_stages(self, loader: str) -> None:
        if self.stages:
            names = ", ".join(s.name for s in self.stages)
            raise ConfigError(
                f"{loader} runs no preprocessing stages ({names}): materialize them "
                "(DataSpec.materialize) and load that export with skip_pipeline_stages=True, "
                "or use TorchLoader"
            )

    def one_split(self, loader: str) -> str:
        splits = (self.source.split,) if self.source.split else tuple(self.source._config.splits)
        if len(splits) == 1:
            return splits[0]
        raise ConfigError(
            f"{loader} reads one split and {os.fspath(self.source.root)} has "
            f"{', '.join(splits)}: name one with ExportedDataset(split=...)"
        )

    def scenario(self) -> dict[str, Any]:
        """The spec-file form of the preprocessing (for ``export-dataset --preprocess``)."""
        entries = []
        for stage in self.preprocessing:
            if isinstance(stage, Stage):
                entry = stage.describe()
                if type(stage).__module__.split(".")[:2] != ["shardex", "pipeline"]:
                    entry["stage"] = f"{type(stage).__module__}:{type(stage).__qualname__}"
                stage = entry
            entries.append(dict(stage))
        return {"source": os.fspath(self.source.root), "stages": entries}

    def materialize(
        self,
        output: str | os.PathLike[str],
        *,
        backend: str = "webdataset",
        samples_per_shard: int = 1000,
        until_keys: Sequence[str] = (),
        executor: Any = None,
        **options: Any,
    ) -> ExportConfig:
        """Run the stages in an export of the source to ``output``, until ``until_keys``
        exist (``options`` as :class:`~shardex.pipeline.ImageWriterStage`'s)."""
        from shardex.pipeline import ImageWriterStage, LocalExecutor, Pipeline, ReaderStage
        from shardex.pipeline.onload import declared
        from shardex.sources import open_source

        source = open_source(os.fspath(self.source.root), self.source.options)
        if until_keys:
            options.setdefault("with_keys", tuple(until_keys))
        writer = ImageWriterStage(
            output, samples_per_shard, backend=backend, storage_options=self.source.options,
            **options,
        )  # fmt: skip
        pipeline = Pipeline("materialize", [ReaderStage(source), *declared(self.preprocessing)])
        return pipeline.add_stage(writer).run(executor or LocalExecutor(1), until_keys=until_keys)


class SpecItems:
    """A DataSpec's samples, map-style; :meth:`__getitems__` runs the stages once per
    batch (a filter stage may leave it shorter)."""

    def __init__(self, source: ExportedDataset, stages: list[Stage], stored: set[str]) -> None:
        from shardex.pipeline.onload import OnLoad

        self.stages = OnLoad(stages)
        self.features, self.labels = source.features, source.labels
        if stages:
            made = {k for s in stages for k in s.produces} | {"image_ext", "pixels_changed"}
            missing = [k for k in (*source.features, *source.labels) if k not in stored | made]
            if missing:
                raise ConfigError(
                    f"key {missing[0]!r} is neither in the export {os.fspath(source.root)} "
                    f"nor made by a preprocessing stage (keys: {', '.join(sorted(stored))})"
                )
            source = dataclasses.replace(source, decode=False, feature_keys=(), label_keys=())
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        got = self.__getitems__([index])
        if not got:
            raise IndexError(f"sample {index} was left out by a preprocessing stage")
        return got[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        if not self.stages.stages:
            return [self.source[int(i)] for i in indices]
        from shardex.pipeline.onload import pipeline_sample

        samples = []
        for index in indices:
            split, local = self.source.locate(int(index))
            ds = self.source.datasets[split]
            samples.append(pipeline_sample(ds[local], split, ds.metadata, local))
        return [self._item(s) for s in self.stages.run(samples)]

    def _item(self, sample: Sample) -> dict[str, Any]:
        from shardex.pipeline.onload import picked

        return {
            "key": sample["key"],
            "split": sample["split"],
            "features": picked(sample, self.features),
            "labels": picked(sample, self.labels),
        }


class _Windows:
    """A TensorShardsLoader's batches by key; other attributes are the loader's."""

    def __init__(self, loader: Any, spec: DataSpec, split: str) -> None:
        self.loader, self.split = loader, split
        self.features, self.labels = spec.source.features, spec.source.labels
        meta = loader.dataset.metadata
        fields = {field_key(f.name) for f in loader.dataset.config.fields}
        self._meta = meta.select([k for k in (*self.features, *self.labels) if k not in fields])
        keys = meta.column("key").to_pylist()
        self._rows = {key: row for row, key in enumerate(keys)} if self._meta.num_columns else {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            by_key = {field_key(n): v for n, v in batch.items() if n != "__key__"}
            rows = [self._rows[k] for k in batch["__key__"]] if self._rows else []
            yield {
                "key": batch["__key__"],
                "features": {k: self._value(by_key, k, rows) for k in self.features},
                "labels": {k: self._value(by_key, k, rows) for k in self.labels},
            }

    def _value(self, by_key: dict[str, Any], key: str, rows: list[int]) -> Any:
        if key in by_key:
            return by_key[key]
        import numpy as np

        import torch

        values = [meta_value(self._meta.column(key), r) for r in rows]
        return torch.as_tensor(np.stack(values)) if values else values
