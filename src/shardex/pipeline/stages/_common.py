"""Small helpers the built-in stages share: naming a sample, fetching a needed key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardex.errors import BadSampleError, ConfigError
from shardex.pipeline.stage import Sample


def sample_name(sample: Sample) -> str:
    """How messages name a sample: its key (or original path)."""
    return repr(sample.get("key", sample.get("original_path", "<sample without a key>")))


def require(sample: Sample, field: str, stage: str, hint: str) -> Any:
    """``sample[field]``, or a ConfigError naming the sample, the stage and what to do."""
    try:
        return sample[field]
    except KeyError:
        raise ConfigError(
            f"{stage} stage: sample {sample_name(sample)} has no {field!r} ({hint}); "
            f"its keys are {sorted(sample)}"
        ) from None


def positive_size(name: str, size: int | Sequence[int]) -> tuple[int, int]:
    """``size`` as (width, height): an int means a square; ConfigError unless positive."""
    values = (size, size) if isinstance(size, int) else tuple(size)
    if len(values) != 2 or not all(type(v) is int and v > 0 for v in values):
        raise ConfigError(f"{name}={size!r} must be a positive int or (width, height)")
    return values[0], values[1]


def bad_sample(sample: Sample, stage: str, exc: Exception) -> BadSampleError:
    path = str(sample.get("original_path") or sample.get("key", ""))
    return BadSampleError(
        f"{stage} stage: sample {sample_name(sample)} ({path}): cannot decode its image: {exc}",
        path=path,
        reason=str(exc),
    )
