"""A NeMo Curator-style pipeline: read -> filter by score -> embed -> ImageWriterStage.

    python examples/nemo_style.py [SOURCE] [OUTPUT]     # default: demo -> nemo-export

Swap ``shardex.testing.models:tiny_embedder`` for your own ``module:factory`` (and
``weights=`` for a local state-dict file).
"""

from __future__ import annotations

import sys

import shardex
from shardex.pipeline import ImageWriterStage, LocalExecutor, Pipeline, ReaderStage
from shardex.pipeline.stages import DecodeStage, EmbedStage, FilterStage


def main(source: str = "demo", output: str = "nemo-export") -> shardex.ExportConfig:
    pipeline = Pipeline("curate")
    pipeline.add_stage(ReaderStage(source, batch_size=256))
    pipeline.add_stage(FilterStage("aesthetic_score > 5"))
    pipeline.add_stage(DecodeStage())
    pipeline.add_stage(
        EmbedStage("shardex.testing.models:tiny_embedder", key="clip_embedding", input_size=64)
    )
    pipeline.add_stage(ImageWriterStage(output, images_per_tar=1000, deterministic_name=True))
    config = pipeline.run(executor=LocalExecutor(workers=2))
    tars = [shard.num_samples for shard in config.split("train").shards]
    print(f"kept {config.num_samples} images in tars of {tars}")
    meta = shardex.open_dataset(output).metadata
    print(meta.select(["image_id", "tar_file", "aesthetic_score", "clip_embedding"]).slice(0, 3))
    return config


if __name__ == "__main__":
    main(*sys.argv[1:3])
