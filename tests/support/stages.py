"""Small stages for pipeline tests (importable by workers and Ray actors alike)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from shardex.errors import ShardexError
from shardex.pipeline.stage import Batch, Stage


class TagStage(Stage):
    """Adds ``key`` -> a float derived from the sample key (deterministic)."""

    name: ClassVar[str] = "test_tag"

    def __init__(self, key: str = "tag", needs: tuple[str, ...] = ()) -> None:
        self.key = key
        self.needs = needs
        self.produces = (key,)

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            sample[self.key] = float(sum(sample["key"].encode()) % 97) / 10
        return batch


class VectorStage(Stage):
    """Adds ``key`` -> a float32 vector (a stand-in for an embedding)."""

    name: ClassVar[str] = "test_vector"
    produces = ("vector",)

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            seed = sum(sample["key"].encode())
            sample["vector"] = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
        return batch


class InvertStage(Stage):
    """Inverts ``pixels`` (a pixel change: the writer must re-encode)."""

    name: ClassVar[str] = "test_invert"
    needs = ("pixels",)

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            sample["pixels"] = 255 - sample["pixels"]
            sample["pixels_changed"] = True
        return batch


class FailStage(Stage):
    """Raises: proves a stage never ran."""

    name: ClassVar[str] = "test_fail"
    produces = ("never",)

    def process(self, batch: Batch) -> Batch:
        raise ShardexError("FailStage ran")


class CountSetup(Stage):
    """Records in each sample how many times this worker's copy was set up."""

    name: ClassVar[str] = "test_setup"
    produces = ("setups",)

    def __init__(self) -> None:
        self._setups = 0

    def setup(self) -> None:
        self._setups += 1

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            sample["setups"] = self._setups
        return batch

    def params(self) -> dict[str, Any]:
        return {}


class PidStage(Stage):
    """Adds ``pid``: the process that ran the stage (a loader's worker, or not)."""

    name: ClassVar[str] = "test_pid"
    produces = ("pid",)

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            sample["pid"] = os.getpid()
        return batch
