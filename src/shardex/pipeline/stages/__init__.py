"""Built-in pipeline stages: decode, resize, center-crop, encode, filter, dedup, embed.

Each stage's ``params()`` are its constructor's keyword arguments, so a config.yaml
``describe()`` entry rebuilds the stage. None of these modules imports torch.
"""

from __future__ import annotations

from typing import Final

from shardex.pipeline.stage import Stage
from shardex.pipeline.stages.dedup import DedupStage, NeighbourIndex, perceptual_hash
from shardex.pipeline.stages.embed import EmbedStage
from shardex.pipeline.stages.encode import EncodeStage
from shardex.pipeline.stages.filter import FilterStage
from shardex.pipeline.stages.images import CenterCropStage, DecodeStage, ResizeStage

#: Stage name (as in config.yaml and spec files) -> class.
BUILTIN_STAGES: Final[dict[str, type[Stage]]] = {
    cls.name: cls
    for cls in (
        DecodeStage,
        ResizeStage,
        CenterCropStage,
        EncodeStage,
        FilterStage,
        DedupStage,
        EmbedStage,
    )
}

__all__ = [
    "BUILTIN_STAGES",
    "CenterCropStage",
    "DecodeStage",
    "DedupStage",
    "EmbedStage",
    "EncodeStage",
    "FilterStage",
    "NeighbourIndex",
    "ResizeStage",
    "perceptual_hash",
]
