"""Curation pipelines: stages over batches of samples, run locally or on Ray, ending in
``ImageWriterStage`` (NeMo Curator's parameters) that writes the shardex format.

See docs/pipeline.md.
"""

from __future__ import annotations

from shardex.pipeline.executors import Executor, LocalExecutor
from shardex.pipeline.pipeline import Pipeline
from shardex.pipeline.ray_executor import RayExecutor
from shardex.pipeline.readers import ReaderStage
from shardex.pipeline.spec import Spec, materialize, run_spec
from shardex.pipeline.stage import Batch, Resources, Sample, Stage
from shardex.pipeline.writer import ImageWriterStage

__all__ = [
    "Batch",
    "Executor",
    "ImageWriterStage",
    "LocalExecutor",
    "Pipeline",
    "RayExecutor",
    "ReaderStage",
    "Resources",
    "Sample",
    "Spec",
    "Stage",
    "materialize",
    "run_spec",
]
