"""Export options: every flag of ``shardex export-dataset`` as one frozen record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from shardex.codecs.images import MAX_PIXELS, VALIDATE_CHOICES, Validate
from shardex.errors import ConfigError
from shardex.names import split_name_problem
from shardex.sample_check import OnError

#: What to do with an output that already holds an export or an interrupted one.
Mode = Literal["error", "overwrite", "resume", "append"]
MODES: tuple[Mode, ...] = ("error", "overwrite", "resume", "append")
#: Where a split's files go: a folder per split, or the top level (NeMo Curator's layout).
Layout = Literal["split", "flat"]
LAYOUTS: tuple[Layout, ...] = ("split", "flat")
#: Floating-point dtypes ``--dtype`` may cast to (bfloat16: backends that can store it).
FLOAT_DTYPES: tuple[str, ...] = ("float16", "float32", "float64", "bfloat16")


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """How to export. Every CLI flag of ``export-dataset`` maps to one field."""

    backend: str = "webdataset"
    splits: tuple[str, ...] | None = None
    x_keys: tuple[str, ...] | None = None
    #: Keys stored beside the default features when ``x_keys`` is not given.
    with_keys: tuple[str, ...] = ()
    y_keys: tuple[str, ...] | None = None
    labels: bool = True
    samples_per_shard: int = 1000
    max_shard_bytes: int | None = None
    deterministic_name: bool = True
    split_fractions: dict[str, float] | None = None
    seed: int = 0
    workers: int | None = None
    mode: Mode = "error"
    overwrite: bool = False  # shorthand for mode="overwrite"
    on_error: OnError = "error"
    validate: Validate = "header"
    max_pixels: int = MAX_PIXELS
    #: Cast of floating-point array fields (``bfloat16``: where ``capabilities.bfloat16``).
    dtype: str | None = None
    #: Every image stored as ``KEY.<image_member>`` whatever its format (docs/interop.md).
    image_member: str | None = None
    backend_options: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    layout: Layout = "split"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.overwrite:
            if self.mode not in ("error", "overwrite"):
                raise ConfigError(f"overwrite=True and mode={self.mode!r} contradict each other")
            object.__setattr__(self, "mode", "overwrite")
        if self.samples_per_shard < 1:
            raise ConfigError(f"samples_per_shard must be >= 1, got {self.samples_per_shard}")
        if self.max_shard_bytes is not None and self.max_shard_bytes < 1:
            raise ConfigError(f"max_shard_bytes must be >= 1, got {self.max_shard_bytes}")
        if self.dtype is not None and self.dtype not in FLOAT_DTYPES:
            raise ConfigError(
                f"dtype must be float16, float32, float64 or bfloat16 (floating-point fields "
                f"only), got {self.dtype!r}"
            )
        if self.image_member is not None:
            from shardex.image_member import image_member_problem

            problem = image_member_problem(self.image_member)
            if problem is not None:
                raise ConfigError(problem)
        if self.on_error not in ("error", "skip"):
            raise ConfigError(f"on_error must be 'error' or 'skip', got {self.on_error!r}")
        if self.validate not in VALIDATE_CHOICES:
            raise ConfigError(f"validate must be one of {VALIDATE_CHOICES}, got {self.validate!r}")
        # split names become folders of the output
        for option, names in (("splits", self.splits), ("split_fractions", self.split_fractions)):
            for name in names or ():
                problem = split_name_problem(name)
                if problem is not None:
                    raise ConfigError(f"{option}: {problem}")
        self._check_layout()
        if self.split_fractions is not None:
            total = sum(self.split_fractions.values())
            if (
                not self.split_fractions
                or any(v < 0 for v in self.split_fractions.values())
                or abs(total - 1.0) > 1e-6
            ):
                raise ConfigError(
                    f"split fractions must be >= 0 and sum to 1, got {self.split_fractions}"
                )

    def _check_layout(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be 'split' or 'flat', got {self.layout!r}")
        if self.layout != "flat":
            return
        for option, names in (("splits", self.splits), ("split_fractions", self.split_fractions)):
            if names is not None and len(names) > 1:
                raise ConfigError(
                    f"layout='flat' holds one split, and {option} names {len(names)} "
                    f"({', '.join(map(repr, names))}); export one split, or use the default "
                    "layout (a folder per split)"
                )


def parse_split_fractions(text: str) -> dict[str, float]:
    """``"train=0.8,val=0.1,test=0.1"`` -> ``{"train": 0.8, "val": 0.1, "test": 0.1}``."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        try:
            if not eq or not name.strip():
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ConfigError(
                f"bad split fraction {part!r}: use NAME=FRACTION, e.g. train=0.8,val=0.2"
            ) from None
    return out
