"""Stages on loaded samples: a spec's ``preprocessing`` run by a loader, not an export.

:func:`stages_to_run` skips the stages config.yaml records as already run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from shardex.contract import ExportConfig
from shardex.errors import ConfigError
from shardex.exported import meta_value
from shardex.fields import field_key, load_npy
from shardex.pipeline.readers import ReaderStage
from shardex.pipeline.spec import build_stage
from shardex.pipeline.stage import Batch, Sample, Stage

#: Columns the export keeps about where a sample lies, not what it holds.
_BOOKKEEPING = frozenset(
    {"image_id", "tar_file", "member_name", "metadata", "export_index", "sample_index"}
)


def declared(stages: Sequence[Stage | Mapping[str, Any]]) -> list[Stage]:
    """Stages given as objects or as spec-file entries (``{"stage": "resize", "size": 32}``)."""
    out = [s if isinstance(s, Stage) else build_stage(dict(s), "preprocessing") for s in stages]
    for stage in out:
        if type(stage).reduce is not Stage.reduce:
            raise ConfigError(
                f"preprocessing: stage {stage.name!r} needs to see every sample (it reduces "
                "across batches), which a loader cannot do: run it in an export "
                "(DataSpec.materialize) and load that with skip_pipeline_stages=True"
            )
    return out


def _normal(entry: Mapping[str, Any]) -> Any:
    return json.loads(json.dumps(dict(entry), sort_keys=True, default=str))


def stages_to_run(
    stages: list[Stage], config: ExportConfig, stored: set[str], asked: set[str], where: str
) -> list[Stage]:
    """The declared ``stages`` minus the prefix the export's recorded pipeline already ran.

    A skipped decode whose ``pixels`` are needed but not stored runs again (the stored
    image is what the export kept of those pixels).

    Raises:
        ConfigError: the recorded and declared stages differ, or a needed key made by a
            skipped stage is not stored.
    """
    recorded = [e for e in config.pipeline if e.get("stage") != ReaderStage.name]
    for number, entry in enumerate(recorded, 1):
        if number > len(stages):
            raise ConfigError(
                f"{where} was made by stage {entry.get('stage')!r} (number {number} of its "
                "pipeline), which the spec's preprocessing does not declare; declare it, or "
                "set skip_pipeline_stages=False"
            )
        stage = stages[number - 1]
        if entry.get("stage") != stage.name:
            raise ConfigError(
                f"{where} ran stage {entry.get('stage')!r} where the spec's preprocessing "
                f"declares {stage.name!r} (number {number}); declare the export's stages "
                "first, in its order"
            )
        if _normal(entry) != _normal(stage.describe()):
            ran = {k: v for k, v in _normal(entry).items() if k != "stage"}
            raise ConfigError(
                f"stage {stage.name!r} (number {number}) ran on {where} with {ran}, but the "
                f"spec's preprocessing declares {_normal(stage.params())}: it would not be the "
                "same data; declare what the export ran, or export again"
            )
    skipped, rest = stages[: len(recorded)], stages[len(recorded) :]
    wanted = ({k for s in rest for k in s.needs} | asked) - stored
    views = []
    for stage in skipped:
        made = set(stage.produces) & wanted
        if made and tuple(stage.needs) == ("image",) and set(stage.produces) == {"pixels"}:
            views = [stage]  # the last decode gives the pixels the next stages saw
        elif made:
            raise ConfigError(
                f"{where} ran stage {stage.name!r}, which made {', '.join(sorted(made))}, "
                "but does not store it, and a later stage or key needs it; export it as a feature "
                "(--x-key) or set skip_pipeline_stages=False"
            )
    return [*views, *rest]


class OnLoad:
    """Stored samples -> pipeline samples -> ``stages`` -> the keys asked for."""

    def __init__(self, stages: list[Stage]) -> None:
        self.stages = stages
        self._ready = False

    def __getstate__(self) -> dict[str, Any]:
        return {"stages": self.stages, "_ready": False}  # set up again in each worker

    def run(self, samples: list[Sample]) -> Batch:
        if not self._ready:
            for stage in self.stages:
                stage.setup()
            self._ready = True
        batch: Batch = samples
        for stage in self.stages:
            batch = stage.process(batch) or []
            if not batch:
                break
        return batch


def pipeline_sample(stored: Mapping[str, Any], split: str, meta: pa.Table, row: int) -> Sample:
    """A stored sample (``decode=False`` fields) and its metadata row as a pipeline sample."""
    sample: Sample = {"key": stored["__key__"], "split": split}
    for column in meta.column_names:
        if column not in _BOOKKEEPING and not column.startswith("sample_"):
            sample[column] = meta_value(meta.column(column), row)
    for name, value in stored.items():
        key = field_key(name)
        if name in ("__key__", "json"):
            continue
        if key == "image":
            sample["image"], sample["image_ext"] = bytes(value), name
        elif key == "label":
            sample["label"] = int(bytes(value))
        elif name.endswith(".npy"):
            sample[key] = load_npy(value, f"{stored['__key__']}.{name}")
        else:
            sample[key] = bytes(value)
    return sample


def picked(sample: Sample, keys: Sequence[str]) -> dict[str, Any]:
    """``keys`` of a sample after the stages; lists of numbers as arrays."""
    missing = [k for k in keys if k not in sample]
    if missing:
        raise ConfigError(
            f"sample {sample.get('key')!r} has no {', '.join(missing)} after preprocessing "
            f"(keys: {', '.join(sorted(sample))})"
        )
    return {k: _array(sample[k]) for k in keys}


def _array(value: Any) -> Any:
    if isinstance(value, list) and value and all(isinstance(v, int | float) for v in value):
        return np.asarray(value)
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        return value.copy()  # torch warns on (and may write to) a read-only array
    return value
